"""``--neuraldbg-pictures``: ``all`` draws the healthy runs too, ``off`` draws none, the default only the unhealthy
runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from integration_support import SILENT_TESTS

from neuraldbg.export import pictures

pytest.importorskip("matplotlib")
# draw once now: pytester unloads the modules an in-process run imported, and matplotlib does not survive that
pictures.render("gradient-flow", pictures.Grid("grad_norm", ["a"], [0, 1], [[1.0, 2.0]]), pictures.Marks(), "svg")


def drawn(report: Path) -> dict[str, list[str]]:
    """Picture files by test: ``{"test_healthy": [...], "test_dead": [...]}``."""
    found: dict[str, list[str]] = {}
    for path in sorted(report.iterdir()):
        if path.suffix in (".png", ".svg"):
            test = path.name.split(".py_", 1)[1].split("-", 1)[0]
            found.setdefault(test, []).append(path.name)
    return found


def test_all_draws_the_healthy_runs_too_from_their_own_history(project: pytest.Pytester) -> None:
    project.makepyfile(test_silent=SILENT_TESTS)
    project.runpytest("--neuraldbg-report=report", "--neuraldbg-pictures=all").assert_outcomes(passed=2)
    report = project.path / "report"
    found = drawn(report)
    assert set(found) == {"test_healthy", "test_dead"}
    trace = json.loads((report / "test_silent.py_test_healthy.json").read_text("utf-8"))
    (flow,) = report.glob("test_silent.py_test_healthy-*.gradient-flow.png")
    data = pictures.embedded(flow.read_bytes())
    assert (data["root"], data["onset"]) == (None, None)  # a healthy run marks nothing
    history = trace["history"]["grad_norm"]
    for layer, row in zip(data["layers"], data["values"]):
        recorded = {int(s): v for s, v in history[layer]}
        assert row == [recorded.get(step) for step in data["steps"]]
    assert (report / "report.html").read_text("utf-8").count("data:image/svg+xml;base64,") >= 4


def test_off_draws_nothing_and_asks_for_nothing(project: pytest.Pytester) -> None:
    project.makepyfile(test_silent=SILENT_TESTS)
    project.runpytest("--neuraldbg-report=report", "--neuraldbg-pictures=off").assert_outcomes(passed=2)
    report = project.path / "report"
    assert drawn(report) == {}
    assert "matplotlib" not in (report / "summary.md").read_text("utf-8")
    assert "data:image" not in (report / "report.html").read_text("utf-8")


def test_by_default_only_the_unhealthy_run_is_drawn(project: pytest.Pytester) -> None:
    project.makepyfile(test_silent=SILENT_TESTS)
    project.runpytest("--neuraldbg-report=report").assert_outcomes(passed=2)
    assert set(drawn(project.path / "report")) == {"test_dead"}
