"""Under pytest-xdist (``-n 2``) the outcomes, JUnit properties and report files match a serial run."""

from __future__ import annotations

from pathlib import Path

import pytest
from integration_support import SILENT_TESTS, junit_cases, properties

pytest.importorskip("xdist")

MORE_TESTS = """
import models
import pytest
from pytest_neuraldbg import assert_no_dead_neurons

def test_helper_fails(neuraldbg):
    assert_no_dead_neurons(neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=30))

def test_two_runs(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=20, name="good")
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=20, name="also-good")

@pytest.mark.xfail(strict=True)
def test_xfail_dead(neuraldbg):
    neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=20)
"""


def outputs(pytester: pytest.Pytester, name: str, *args: str, subprocess: bool) -> tuple[pytest.RunResult, Path]:
    out = pytester.path / name
    options = (
        "--neuraldbg-gate=fail",
        f"--neuraldbg-report={out}/report",
        f"--neuraldbg-junit={out}/health.xml",
        f"--junitxml={out}/junit.xml",
        "-p",
        "no:cacheprovider",
        *args,
    )
    run = pytester.runpytest_subprocess if subprocess else pytester.runpytest
    return run(*options), out


def junit_properties(path: Path) -> dict[str, list[tuple[str, str]]]:
    return {name: properties(case) for name, case in junit_cases(path).items()}


def test_two_workers_give_the_same_outcomes_properties_and_files_as_one_process(project: pytest.Pytester) -> None:
    project.makepyfile(test_silent=SILENT_TESTS, test_more=MORE_TESTS)
    serial, serial_out = outputs(project, "serial", subprocess=False)
    parallel, parallel_out = outputs(project, "parallel", "-n", "2", subprocess=True)

    serial.assert_outcomes(passed=2, failed=2, xfailed=1)
    parallel.assert_outcomes(passed=2, failed=2, xfailed=1)  # the gate's failure is xfail's, on a worker too
    parallel.stdout.fnmatch_lines(["*2 workers*"])  # it really ran distributed
    parallel.stdout.fnmatch_lines(["FAILED test_silent.py::test_dead - NeuralDBG gate: training is unhealthy*"])

    # the terminal summary is printed once, by the controller, and lists every run
    text = parallel.stdout.str()
    assert text.count("= neuraldbg =") == 1
    assert "6 watched runs: 3 unhealthy (gate: fail)" in text
    assert text.count("neuraldbg: wrote ") == 3  # summary.md, report.html, the health JUnit

    # pytest's JUnit: the same properties for every test, carried from the workers
    props = junit_properties(parallel_out / "junit.xml")
    assert props == junit_properties(serial_out / "junit.xml")
    assert dict(props["test_silent::test_dead"])["neuraldbg.verdict"] == "unhealthy"
    assert props["test_more::test_two_runs"] == [
        ("neuraldbg.run", "good"),
        ("neuraldbg.verdict", "healthy"),
        ("neuraldbg.run", "also-good"),
        ("neuraldbg.verdict", "healthy"),
    ]  # healthy runs carry their verdict only

    # the files, written once on the controller, are complete and identical to the serial ones
    for name in ("summary.md", "test_silent.py_test_dead.json", "test_more.py_test_two_runs-run-also-good.mmd"):
        assert (parallel_out / "report" / name).read_text("utf-8") == (serial_out / "report" / name).read_text("utf-8")
    assert sorted(p.name for p in (parallel_out / "report").iterdir()) == sorted(
        p.name for p in (serial_out / "report").iterdir()
    )
    summary = (parallel_out / "report" / "summary.md").read_text("utf-8")
    assert summary.count("| ❌ unhealthy") == 3 and summary.count("| ✅ healthy |") == 3
    assert "| xfailed | ❌ unhealthy (expected: xfail) |" in summary
    health = (parallel_out / "health.xml").read_text("utf-8")
    assert health == (serial_out / "health.xml").read_text("utf-8")
    assert health.count("<testcase ") == 6 * 9  # per run: eight layer-level checks and "observed"
