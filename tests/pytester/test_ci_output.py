"""Under GitHub Actions an unhealthy gated test is annotated at its line; under -v a smoke run shows its progress
although pytest captures the test's output."""

from __future__ import annotations

import pytest
from integration_support import SILENT_TESTS


def test_an_unhealthy_gated_test_is_annotated_for_the_diff_view(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    project.makepyfile(test_silent=SILENT_TESTS)
    result = project.runpytest("--neuraldbg-gate")
    result.assert_outcomes(passed=1, failed=1)
    lines = [line for line in result.stdout.lines if line.startswith("::error ")]
    source = (project.path / "test_silent.py").read_text("utf-8").splitlines()
    at = source.index("def test_dead(neuraldbg):") + 1  # the test's own line
    assert lines == [
        f"::error file=test_silent.py,line={at},title=NeuralDBG::NeuralDBG: training is unhealthy - dead_neurons at "
        "'3' from step 0 (confidence 1.00)"
    ]


def test_no_annotation_outside_github(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    project.makepyfile(test_silent=SILENT_TESTS)
    result = project.runpytest("--neuraldbg-gate")
    assert "::error" not in result.stdout.str()


def test_under_v_a_smoke_run_shows_its_progress_past_output_capture(project: pytest.Pytester) -> None:
    project.makepyfile(test_silent=SILENT_TESTS)
    result = project.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "neuraldbg: test_silent.py::test_healthy: step 1/30, loss *",
            "neuraldbg: test_silent.py::test_healthy: step 30/30, loss *",
            "neuraldbg: test_silent.py::test_healthy: done, healthy",
        ]
    )
