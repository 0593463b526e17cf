"""The assertion helpers and ``assert not ndbg.explain_failure()``: what a failing test prints."""

from __future__ import annotations

import pytest

TESTS = """
import models
import pytest
from neuraldbg import FailureKind
from pytest_neuraldbg import (
    assert_finite, assert_healthy, assert_no_dead_neurons, assert_no_exploding_gradients,
    assert_no_saturation, assert_no_vanishing_gradients, assert_parameters_update,
)


@pytest.fixture
def dead(neuraldbg):
    return neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=30)


def test_healthy_passes_every_helper(neuraldbg):
    ndbg = neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=30)
    for check in (assert_healthy, assert_no_vanishing_gradients, assert_no_exploding_gradients,
                  assert_no_dead_neurons, assert_no_saturation, assert_finite, assert_parameters_update):
        check(ndbg)


def test_dead_assert_healthy(dead):
    assert_healthy(dead)


def test_dead_vanishing(dead):
    assert_no_vanishing_gradients(dead)


def test_dead_max_fraction(dead):
    assert_no_dead_neurons(dead, max_fraction=0.9)


def test_dead_ignored(dead):
    assert_healthy(dead, ignore=[FailureKind.DEAD_NEURONS])
    assert_healthy(dead, ignore="dead_neurons")
    assert_no_exploding_gradients(dead)
    assert_finite(dead)


def test_dead_assert_not_explain(dead):
    assert not dead.explain_failure()


def test_dead_equals_empty(dead):
    assert dead.explain_failure() == []
"""


@pytest.fixture
def result(project: pytest.Pytester) -> pytest.RunResult:
    project.makepyfile(test_helpers=TESTS)
    return project.runpytest("--junitxml=junit.xml", "-rA")


def test_healthy_training_passes_every_helper_and_ignore_accepts_kinds_and_strings(result: pytest.RunResult) -> None:
    result.assert_outcomes(passed=2, failed=5)
    result.stdout.fnmatch_lines(
        ["PASSED test_helpers.py::test_healthy_passes_every_helper", "PASSED test_helpers.py::test_dead_ignored"],
        consecutive=True,
    )


def test_a_dead_relu_fails_assert_healthy_with_the_dead_layer_and_the_step(result: pytest.RunResult) -> None:
    result.stdout.fnmatch_lines(
        [
            "*def test_dead_assert_healthy(dead):*",
            "E       AssertionError: NeuralDBG: training is unhealthy - dead_neurons at '3' from step 0 (confidence *)",
            "E       Dead neurons in '3' (ReLU), fed by '2' (Linear)*",
            "E       Causal chain (root first):",
            "E         root '3': * units dead (never positive), steps 0-*",
            "E           -> '0': gradient *, steps 0-*('3' zeroes the gradient of '0')",
        ]
    )


def test_helper_frames_are_hidden_from_the_traceback(result: pytest.RunResult) -> None:
    assert "pytest_neuraldbg/assertions.py" not in result.stdout.str()
    assert "__tracebackhide__" not in result.stdout.str()


def test_a_vanishing_gradient_check_names_the_dead_layer_as_the_cause(result: pytest.RunResult) -> None:
    result.stdout.fnmatch_lines(
        ["E       AssertionError: NeuralDBG: vanishing gradients in '0', '2' from step 0, caused by dead_neurons*"]
    )


def test_max_fraction_fails_a_layer_with_more_dead_units(result: pytest.RunResult) -> None:
    result.stdout.fnmatch_lines(["E       AssertionError: NeuralDBG: dead neurons - dead_neurons at '3' from step 0*"])


def test_assert_not_explain_failure_shows_a_readable_verdict(result: pytest.RunResult) -> None:
    result.stdout.fnmatch_lines(
        [
            "E       AssertionError: assert not <unhealthy training: dead_neurons at '3' from step 0 (confidence *)>",
            "E        +  where <unhealthy training: *> = explain_failure()",
        ]
    )
    # the full explanation follows in the test's NeuralDBG section
    result.stdout.fnmatch_lines(
        ["*test_dead_assert_not_explain*", "*- NeuralDBG training health -*", "Dead neurons in '3' (ReLU)*"]
    )


def test_comparing_explain_failure_with_an_empty_list_prints_every_explanation(result: pytest.RunResult) -> None:
    result.stdout.fnmatch_lines(
        [
            "E       AssertionError: assert <unhealthy training: dead_neurons at '3' from step 0 (confidence *)> == []",
            "E         NeuralDBG found a training failure:",
            "E           1. Dead neurons in '3' (ReLU)*",
        ]
    )


def test_the_junit_failure_message_starts_with_the_one_line_verdict(
    result: pytest.RunResult, project: pytest.Pytester
) -> None:
    from integration_support import junit_cases

    case = junit_cases(project.path / "junit.xml")["test_helpers::test_dead_assert_healthy"]
    failure = case.find("failure")
    assert failure is not None
    message = failure.get("message", "")
    assert message.splitlines()[0].startswith(
        "AssertionError: NeuralDBG: training is unhealthy - dead_neurons at '3' from step 0"
    )
    assert len(message) < 600
    assert "root '3': 100% of" in (failure.text or "")
