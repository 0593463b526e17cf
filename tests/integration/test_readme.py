"""The README's code runs as written: its test file passes under the README's own CI command, its other Python
blocks run as scripts, and the output it quotes for the demo is what the demo prints."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

import neuraldbg.demo

README = Path(__file__).resolve().parents[2] / "README.md"
TEXT = README.read_text(encoding="utf-8")
PYTHON = re.findall(r"^```python\n(.*?)^```$", TEXT, re.DOTALL | re.MULTILINE)
TEST_FILES = [block for block in PYTHON if re.search(r"^def test_", block, re.MULTILINE)]
SCRIPTS = [block for block in PYTHON if block not in TEST_FILES]


def ci_command() -> list[str]:
    """The arguments of the pytest command in the README's GitHub Actions example."""
    runs = re.findall(r"^\s*run: (python -m pytest .*)$", TEXT, re.MULTILINE)
    assert len(runs) == 1, runs
    return shlex.split(runs[0])[3:]  # after "python -m pytest"


def test_the_readme_has_the_blocks_these_tests_run() -> None:
    assert len(TEST_FILES) == 1 and len(SCRIPTS) == 2  # a new block is run too: update the counts
    assert ci_command() == ["tests/training", "--neuraldbg-gate", "--neuraldbg-report=neuraldbg-report"]


def test_the_readme_test_file_passes_under_the_readmes_ci_command(pytester: pytest.Pytester) -> None:
    args = ci_command()
    folder = pytester.mkdir(args[0].split("/")[0]) / args[0].split("/")[1]
    folder.mkdir()
    (folder / "test_readme_example.py").write_text(TEST_FILES[0], encoding="utf-8")
    result = pytester.runpytest(*args)
    tests = re.findall(r"^def (test_\w+)", TEST_FILES[0], re.MULTILINE)
    result.assert_outcomes(passed=len(tests))  # the test that expects the dead ReLU is not failed by the gate
    summary = (pytester.path / "neuraldbg-report" / "summary.md").read_text("utf-8")
    assert "**No test watching training failed, but 1 of 3 watched runs are unhealthy**" in summary
    assert "| passed | ❌ unhealthy (expected by the test) |" in summary


@pytest.mark.parametrize("index", range(len(SCRIPTS)))
def test_each_other_python_block_runs_as_a_script(pytester: pytest.Pytester, index: int) -> None:
    script = pytester.path / f"block_{index}.py"
    script.write_text(SCRIPTS[index], encoding="utf-8")
    result = pytester.run(sys.executable, "-W", "ignore", str(script), timeout=300)
    assert result.ret == 0, result.stderr.str()
    if "explain_failure()" in SCRIPTS[index]:  # the engine snippet: its model trains healthily on its data
        assert result.stdout.str() == ""  # "[] when training is healthy": nothing printed


def test_the_output_quoted_for_the_demo_is_what_the_demo_prints() -> None:
    quoted = re.search(r"For the demo's model that prints:\n\n```\n(.*?)\n```", TEXT, re.DOTALL)
    assert quoted is not None
    printed = neuraldbg.demo.dead_layer().explain_failure()
    assert [" ".join(quoted.group(1).split())] == [" ".join(text.split()) for text in printed]
