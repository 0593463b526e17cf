"""``--neuraldbg-report=DIR``: traces, causal graphs and a ``summary.md`` that GitHub renders."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from integration_support import SILENT_TESTS, render_mermaid

import neuraldbg

ODD_IDS = """
import models
import pytest

@pytest.mark.parametrize("case", ["a/b c", "x::y", "CON"])
def test_odd(neuraldbg, case):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=10)
"""

MERMAID_BLOCK = re.compile(r"```mermaid\n(.*?)\n```", re.DOTALL)


@pytest.fixture
def report_dir(project: pytest.Pytester) -> Path:
    project.makepyfile(test_silent=SILENT_TESTS, test_odd=ODD_IDS)
    project.runpytest("--neuraldbg-report=reports").assert_outcomes(passed=5)
    return project.path / "reports"


def test_summary_md_has_the_table_the_explanation_and_collapsed_graphs(report_dir: Path) -> None:
    summary = (report_dir / "summary.md").read_text(encoding="utf-8")
    assert summary.startswith(
        "## NeuralDBG training health\n\n**No test watching training failed, but 1 of 5 watched runs are unhealthy** "
        "(runs: 1 of 5 unhealthy; gate: off).\n\npytest, whole session: 5 passed.\n"
    )
    assert "| Test | Outcome | Training | Kind | Layer | Step | Baseline |" in summary
    assert "| `test_silent.py::test_dead` | passed | ❌ unhealthy | dead\\_neurons | `3` | 0 | - |" in summary
    assert "| `test_silent.py::test_healthy` | passed | ✅ healthy | - | - | - | - |" in summary
    assert "- ✅ `test_silent.py::test_healthy`: 30 steps, final loss " in summary  # key numbers, one line
    assert summary.count("| passed | ✅ healthy |") == 4
    assert "### ❌ `test_silent.py::test_dead`" in summary
    assert "Dead neurons in '3' (ReLU), fed by '2' (Linear)" in summary
    assert "<details><summary>Causal graph</summary>\n\n```mermaid\nflowchart TD" in summary
    assert "```mermaid\n%%{init:" in summary and "xychart-beta" in summary
    # the first layer's and the root's feeder's zero norms would hide each other: one line, both labels
    assert "Lines: 🔵 first layer '0' = '2' (feeds root '3') · 🔴 last layer '4'." in summary
    assert '  x-axis "step" 0 --> 29' in summary  # the whole 30-step run
    assert len(summary) < 65_536


def test_every_mermaid_block_of_the_summary_renders(report_dir: Path) -> None:
    blocks = MERMAID_BLOCK.findall((report_dir / "summary.md").read_text(encoding="utf-8"))
    assert len(blocks) == 2  # the causal graph and the gradient chart of the one unhealthy run
    for block in blocks:
        render_mermaid(block)


def test_each_run_has_a_trace_that_loads_back_and_a_graph_file(report_dir: Path) -> None:
    trace = neuraldbg.load(report_dir / "test_silent.py_test_dead.json")
    assert trace.hypotheses()[0].root.layer == "3"
    assert trace.explain_failure()[0].startswith("Dead neurons in '3' (ReLU)")
    graph = (report_dir / "test_silent.py_test_dead.mmd").read_text(encoding="utf-8")
    assert graph.startswith("flowchart TD") and "dead: 100% of 16 units" in graph
    assert "No training failure detected" in (report_dir / "test_silent.py_test_healthy.mmd").read_text("utf-8")


def test_file_names_from_node_ids_are_sanitised(report_dir: Path) -> None:
    names = sorted(p.name for p in report_dir.iterdir())
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in names), names
    assert {n for n in names if n.startswith("test_odd")} == {
        "test_odd.py_test_odd_CON.json",
        "test_odd.py_test_odd_CON.mmd",
        "test_odd.py_test_odd_a_b_c.json",
        "test_odd.py_test_odd_a_b_c.mmd",
        "test_odd.py_test_odd_x_y.json",
        "test_odd.py_test_odd_x_y.mmd",
    }
    assert len([n for n in names if n.endswith((".json", ".mmd"))]) == 10  # 5 runs x (.json + .mmd)
    assert {"summary.md", "report.html"} <= set(names)
    assert all(n.endswith((".json", ".mmd", ".png", ".svg")) for n in names if n not in ("summary.md", "report.html"))


def test_a_session_without_watched_runs_still_writes_a_summary(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    assert True\n")
    result = pytester.runpytest("--neuraldbg-report=out")
    result.assert_outcomes(passed=1)
    assert (
        (pytester.path / "out" / "summary.md")
        .read_text("utf-8")
        .endswith("No training run was watched.\n\npytest, whole session: 1 passed.\n")
    )
    result.stdout.fnmatch_lines(["neuraldbg: wrote */out/summary.md"])


def test_a_report_dir_from_the_ini_file_is_relative_to_that_file_and_one_from_the_cli_to_the_cwd(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    project.makepyfile(test_silent=SILENT_TESTS)
    project.makeini("[pytest]\nneuraldbg_report = ci/health\n")
    monkeypatch.chdir(project.mkdir("elsewhere"))
    project.runpytest(str(project.path)).assert_outcomes(passed=2)
    assert (project.path / "ci" / "health" / "summary.md").exists()
    project.runpytest(str(project.path), "--neuraldbg-report=here").assert_outcomes(passed=2)
    assert (project.path / "elsewhere" / "here" / "summary.md").exists()
