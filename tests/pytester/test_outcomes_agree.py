"""summary.md, the health JUnit file and pytest's own JUnit agree with the test outcomes, in one session that
mixes a pass, a gate failure, a baseline regression and an xfail; the same on two xdist workers."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from integration_support import junit_cases

MIXED = """
import models
import pytest


def test_pass(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=20)


def test_gate(neuraldbg):
    neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=20)


@pytest.mark.neuraldbg(baseline=True)
def test_baseline(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=20)


@pytest.mark.xfail(strict=True, reason="the dead ReLU is a known bug")
def test_xfail(neuraldbg):
    neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=20)
"""

#: What pytest says of each test; every report below must say the same.
OUTCOMES = {"test_pass": "passed", "test_gate": "failed", "test_baseline": "failed", "test_xfail": "xfailed"}


@pytest.fixture
def mixed(project: pytest.Pytester) -> pytest.Pytester:
    project.makepyfile(test_mixed=MIXED)
    project.runpytest("--neuraldbg-update-baselines", "test_mixed.py::test_baseline").assert_outcomes(passed=1)
    path = project.path / "__neuraldbg__" / "test_mixed" / "test_baseline.json"
    doc = json.loads(path.read_text("utf-8"))
    layer = doc["runs"]["1"]["layers"]["0"]
    layer["grad_norm"] = [v * 100 for v in layer["grad_norm"]]  # the stored norms 100x larger: a regression now
    path.write_text(json.dumps(doc), "utf-8")
    return project


def pytest_outcome(case: ET.Element) -> str:
    """A test's outcome as pytest's JUnit writes it."""
    if case.find("failure") is not None:
        return "failed"
    if case.find("error") is not None:
        return "error"
    skipped = case.find("skipped")
    if skipped is not None:
        return "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
    return "passed"


def check_agreement(result: pytest.RunResult, out: Path) -> None:
    counts = result.parseoutcomes()
    assert (counts.get("passed"), counts.get("failed"), counts.get("xfailed")) == (1, 2, 1)

    # pytest's JUnit
    own = {name.split("::")[-1]: pytest_outcome(case) for name, case in junit_cases(out / "junit.xml").items()}
    assert own == OUTCOMES

    # summary.md: the verdict counts the failed tests, pytest's counts are pytest's, every row has its outcome
    summary = (out / "report" / "summary.md").read_text("utf-8")
    lines = summary.splitlines()
    assert lines[2].startswith("**2 of 4 tests watching training failed** (runs: 2 of 4 unhealthy; ")
    assert "baselines: 1 regressed; gate: fail)." in lines[2]
    assert lines[4] == "pytest, whole session: 2 failed, 1 passed, 1 xfailed."
    assert "healthy**" not in summary  # no "All ... healthy" verdict while tests failed
    rows = {
        re.search(r"test_mixed\.py::(\w+)", row).group(1): row.split(" | ")  # type: ignore[union-attr]
        for row in lines
        if row.startswith("| `")
    }
    assert {test: cells[1].strip("*") for test, cells in rows.items()} == OUTCOMES
    assert rows["test_baseline"][2] == "✅ healthy"  # healthy training, failed on its baseline
    assert rows["test_baseline"][6] == "❌ regressed |"  # the differences are in its section
    assert "- grad\\_norm at '0' 100x smaller at" in summary
    assert rows["test_xfail"][2] == "❌ unhealthy (expected: xfail)"
    assert rows["test_gate"][2] == "❌ unhealthy" and rows["test_pass"][2] == "✅ healthy"
    assert set(list(rows)[:2]) == {"test_gate", "test_baseline"}  # failed tests first
    assert "### ❌ `test_mixed.py::test_baseline`: baseline regressed" in summary

    # the health JUnit: a test failed by pytest has failing cases, and only those tests do: one per fault (the dead
    # ReLU's vanishing gradients are in its case's text); each case's status is its own result
    health = junit_cases(out / "health.xml")
    failing: dict[str, set[str]] = {}
    for name, case in health.items():
        test, check = name.split("::")[1:]
        own = "failed" if case.find("failure") is not None else "passed"
        own = "skipped" if case.find("skipped") is not None else own
        assert case.get("status") == own, name
        if own == "failed":
            failing.setdefault(test, set()).add(check)
    assert failing == {"test_gate": {"dead_neurons"}, "test_baseline": {"baseline"}}
    baseline_case = health["test_mixed.py::test_baseline::baseline"].find("failure")
    assert baseline_case is not None
    assert baseline_case.get("message", "").startswith("NeuralDBG baseline regression: grad_norm at '0'")
    skipped = health["test_mixed.py::test_xfail::dead_neurons"].find("skipped")
    assert skipped is not None and skipped.get("message", "").startswith("expected failure (xfail): NeuralDBG: dead")


def run(pytester: pytest.Pytester, name: str, *args: str, subprocess: bool) -> tuple[pytest.RunResult, Path]:
    out = pytester.path / name
    options = (
        "--neuraldbg-gate",
        f"--neuraldbg-report={out}/report",
        f"--neuraldbg-junit={out}/health.xml",
        f"--junitxml={out}/junit.xml",
        "-p",
        "no:cacheprovider",
        *args,
    )
    return (pytester.runpytest_subprocess if subprocess else pytester.runpytest)(*options), out


def test_the_reports_agree_with_pytest_in_one_process(mixed: pytest.Pytester) -> None:
    check_agreement(*run(mixed, "serial", subprocess=False))


def test_the_reports_agree_with_pytest_on_two_workers(mixed: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    result, out = run(mixed, "parallel", "-n", "2", subprocess=True)
    result.stdout.fnmatch_lines(["*2 workers*"])
    check_agreement(result, out)
