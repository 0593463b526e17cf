"""The README's code runs as written: its test file passes under the README's own CI command, the files it quotes
are the repository's (which the suite runs), its other Python blocks run as scripts, and the output it quotes for
the demo is what the demo prints."""

from __future__ import annotations

import ast
import re
import shlex
import sys
from pathlib import Path

import pytest

import neuraldbg.demo

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
PYTHON = re.findall(r"^```python\n(.*?)^```$", TEXT, re.DOTALL | re.MULTILINE)
#: Blocks that quote a file of the repository: ``<!-- file: PATH -->`` right before the block.
QUOTED = dict(re.findall(r"^<!-- file: (\S+) -->\n```python\n(.*?)^```$", TEXT, re.DOTALL | re.MULTILINE))
OWN = [block for block in PYTHON if block not in QUOTED.values()]
TEST_FILES = [block for block in OWN if re.search(r"^def test_", block, re.MULTILINE)]
SCRIPTS = [block for block in OWN if block not in TEST_FILES]


def ci_command() -> list[str]:
    """The arguments of the pytest command in the README's GitHub Actions example."""
    runs = re.findall(r"^\s*run: (python -m pytest .*)$", TEXT, re.MULTILINE)
    assert len(runs) == 1, runs
    return shlex.split(runs[0])[3:]  # after "python -m pytest"


def without_docstring(source: str) -> str:
    """A module's text after its docstring (the README quotes a file from its first import on)."""
    first = ast.parse(source).body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    lines = source.splitlines(keepends=True)
    return "".join(lines[first.end_lineno :] if docstring else lines).lstrip("\n")


def test_the_readme_has_the_blocks_these_tests_run() -> None:
    # a new block is run too: update the counts (a quoted file: add it to the list)
    assert len(TEST_FILES) == 1 and len(SCRIPTS) == 3
    assert sorted(QUOTED) == [
        "tests/distributed/test_readme_distributed_example.py",
        "tests/distributed/torchrun_train.py",
        "tests/integrations/test_readme_huggingface_example.py",
        "tests/integrations/test_readme_lightning_example.py",
        "tests/test_readme_real_scripts.py",
    ]
    assert ci_command() == ["tests/training", "--neuraldbg-gate", "--neuraldbg-report=neuraldbg-report"]


def test_the_readmes_test_command_is_the_one_ci_runs() -> None:
    command = re.search(r"run the tests \(this is exactly what CI runs, `\.ci/run`\):\n\n```bash\n(.*?)\n```", TEXT)
    assert command is not None
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert command.group(1) + " \\\n" in ci  # the line .ci/run continues with its failure message


@pytest.mark.parametrize("path", sorted(QUOTED))
def test_each_file_the_readme_quotes_is_the_repositorys_file_the_suite_runs(path: str) -> None:
    source = (ROOT / path).read_text(encoding="utf-8")
    assert QUOTED[path] == without_docstring(source), f"README.md quotes {path} as it no longer is"


def test_the_readme_test_file_passes_under_the_readmes_ci_command(pytester: pytest.Pytester) -> None:
    args = ci_command()
    folder = pytester.mkdir(args[0].split("/")[0]) / args[0].split("/")[1]
    folder.mkdir()
    (folder / "test_readme_example.py").write_text(TEST_FILES[0], encoding="utf-8")
    result = pytester.runpytest(*args)
    tests = re.findall(r"^def (test_\w+)", TEST_FILES[0], re.MULTILINE)
    result.assert_outcomes(passed=len(tests))  # the test that expects the dead ReLU is not failed by the gate
    summary = (pytester.path / "neuraldbg-report" / "summary.md").read_text("utf-8")
    assert "**No test watching training failed, but 1 of 4 watched runs are unhealthy**" in summary
    assert "| passed | ❌ unhealthy (expected by the test) |" in summary


@pytest.mark.parametrize("index", range(len(SCRIPTS)))
def test_each_other_python_block_runs_as_a_script(pytester: pytest.Pytester, index: int) -> None:
    script = pytester.path / f"block_{index}.py"
    script.write_text(SCRIPTS[index], encoding="utf-8")
    result = pytester.run(sys.executable, "-W", "ignore", str(script), timeout=300)
    assert result.ret == 0, result.stderr.str()
    if "explain_failure()" in SCRIPTS[index]:  # the engine snippet: its model trains healthily on its data
        assert result.stdout.str() == ""  # "[] when training is healthy": nothing printed
    if "grad_scaler=scaler" in SCRIPTS[index]:  # the mixed-precision snippet: healthy, its scaler's counts shown
        assert result.stdout.lines[0].startswith("NeuralDBG: healthy - no training failure in 100 observed steps")
        assert result.stdout.lines[-1].startswith("{'steps': 100, 'skipped_steps': ")


def test_the_output_quoted_for_the_demo_is_what_the_demo_prints() -> None:
    quoted = re.search(r"For the demo's model that prints:\n\n```\n(.*?)\n```", TEXT, re.DOTALL)
    assert quoted is not None
    printed = neuraldbg.demo.dead_layer().explain_failure()
    assert [" ".join(quoted.group(1).split())] == [" ".join(text.split()) for text in printed]


def test_the_graph_at_the_top_is_the_demos_graph() -> None:
    graph = re.search(r"^```mermaid\n(.*?)\n```$", TEXT, re.DOTALL | re.MULTILINE)
    assert graph is not None
    assert graph.group(1) == neuraldbg.demo.dead_layer().export_mermaid_causal_graph()
