"""``--neuraldbg-gate``: fail (or only report) tests whose watched training is unhealthy."""

from __future__ import annotations

import pytest
from integration_support import SILENT_TESTS, junit_cases


@pytest.fixture
def silent(project: pytest.Pytester) -> pytest.Pytester:
    project.makepyfile(test_silent=SILENT_TESTS)
    return project


def test_the_gate_fails_a_test_that_asserts_nothing_about_its_dead_relu(silent: pytest.Pytester) -> None:
    result = silent.runpytest("--junitxml=junit.xml", "--neuraldbg-gate=fail")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_dead _*",
            "NeuralDBG gate: training is unhealthy - dead_neurons at '3' from step 0 (confidence *)",
            "",
            "Dead neurons in '3' (ReLU)*",
            "Causal chain (root first):",
            "  root activation initial -> dead at '3', steps 0-*",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED test_silent.py::test_dead - NeuralDBG gate: training is unhealthy*"])
    # pytest's own JUnit agrees with the terminal: a failure whose message is the verdict line
    failure = junit_cases(silent.path / "junit.xml")["test_silent::test_dead"].find("failure")
    assert failure is not None
    assert failure.get("message", "").startswith("NeuralDBG gate: training is unhealthy - dead_neurons at '3'")
    assert "Dead neurons in '3' (ReLU)" in (failure.text or "")


def test_a_bare_gate_flag_means_fail(silent: pytest.Pytester) -> None:
    silent.runpytest("--neuraldbg-gate").assert_outcomes(passed=1, failed=1)


def test_warn_reports_the_unhealthy_run_without_failing(silent: pytest.Pytester) -> None:
    result = silent.runpytest("--neuraldbg-gate=warn")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*= neuraldbg =*",
            "2 watched runs: 1 unhealthy (gate: warn)",
            "UNHEALTHY test_silent.py::test_dead: dead_neurons at '3' from step 0 (confidence *)",
        ]
    )


@pytest.mark.parametrize("args", [(), ("--neuraldbg-gate=off",)])
def test_without_the_gate_unhealthy_training_only_shows_in_the_summary(
    silent: pytest.Pytester, args: tuple[str, ...]
) -> None:
    result = silent.runpytest(*args)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["UNHEALTHY test_silent.py::test_dead: *"])


def test_the_gate_is_read_from_the_environment_and_the_failure_says_so(
    silent: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURALDBG_GATE", "fail")
    result = silent.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["Failed by the NeuralDBG gate (gate=fail from env NEURALDBG_GATE).*"])


def test_a_marker_turns_the_gate_off_for_a_test_that_trains_a_broken_model_on_purpose(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(
        test_on_purpose="""
        import models
        import pytest

        @pytest.mark.neuraldbg(gate="off")
        def test_detects_the_dead_relu(neuraldbg):
            ndbg = models.loop(neuraldbg, models.dead())
            assert ndbg.hypotheses()[0].root.layer == "3"
        """
    )
    project.runpytest("--neuraldbg-gate=fail").assert_outcomes(passed=1)


def test_a_test_that_already_failed_keeps_its_own_failure_and_gets_the_explanation_as_a_section(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(
        test_own="""
        import models

        def test_loss_goes_down(neuraldbg):
            models.loop(neuraldbg, models.dead())
            assert 1 == 2, "the loss did not go down"
        """
    )
    result = project.runpytest("--neuraldbg-gate=fail")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E       AssertionError: the loss did not go down",
            "*- NeuralDBG training health -*",
            "NeuralDBG: training is unhealthy - dead_neurons at '3' from step 0*",
        ]
    )
    assert "NeuralDBG gate:" not in result.stdout.str()
