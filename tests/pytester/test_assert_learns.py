"""``assert_learns`` in a test run: a healthy model passes, a broken one fails with the loss curve and the
diagnosis at the test's own line, and a loop that never recorded its loss is told how to."""

from __future__ import annotations

import pytest
from integration_support import junit_cases

LEARNS = """
import models
import torch
from pytest_neuraldbg import assert_learns


def test_healthy(neuraldbg):
    adam = lambda params: torch.optim.Adam(params, lr=1e-2)
    ndbg = neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, optimizer=adam, overfit=True)
    neuraldbg.assert_learns(ndbg)


def test_slow(neuraldbg):
    assert_learns(neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, overfit=True))


def test_dead(neuraldbg):
    assert_learns(neuraldbg.smoke_train(models.dead(), models.data(), models.loss, overfit=True))


def test_own_loop(neuraldbg):
    model = models.healthy()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = models.data()[0]
    with neuraldbg(model) as ndbg:
        for _ in range(30):
            opt.zero_grad()
            out = model(x)
            out.backward(gradient=torch.autograd.grad(models.loss(out, y), out)[0])  # no loss reaches backward()
            opt.step()
    assert_learns(ndbg)
"""


@pytest.fixture
def result(project: pytest.Pytester) -> pytest.RunResult:
    project.makepyfile(test_learns=LEARNS)
    return project.runpytest("--junitxml=junit.xml")


def test_a_healthy_model_passes_and_a_dead_one_fails_with_the_curve_and_the_diagnosis(
    result: pytest.RunResult, project: pytest.Pytester
) -> None:
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(
        [
            "    def test_dead(neuraldbg):",
            ">       assert_learns(neuraldbg.smoke_train(models.dead(), models.data(), models.loss, overfit=True))",
            "E       AssertionError: NeuralDBG: the loss did not fall by 2x over 50 steps: * -> * (fell *x; median of "
            "the first and the last 10 recorded losses)",
            "E       ",
            "E       Loss curve (step: loss): 0: *, 5: *, 49: *",
            "E       ",
            "E       Why, according to NeuralDBG: training is unhealthy - dead_neurons at '3' from step 0 (*)",
            "E       ",
            "E       Dead neurons in '3' (ReLU)*",
            "E       Causal chain (root first):",
            "E         root '3': 100% of 16 units dead (never positive), steps 0-*",
            "*",
            "test_learns.py:17: AssertionError",
        ]
    )
    assert "pytest_neuraldbg/" not in result.stdout.str()  # no plugin frames
    failure = junit_cases(project.path / "junit.xml")["test_learns::test_dead"].find("failure")
    assert failure is not None
    assert failure.get("message", "").startswith("AssertionError: NeuralDBG: the loss did not fall by 2x over 50 steps")


def test_a_healthy_model_that_learns_too_slowly_for_the_check_is_told_so(result: pytest.RunResult) -> None:
    result.stdout.fnmatch_lines(
        [
            "E       AssertionError: NeuralDBG: the loss did not fall by 2x over 50 steps: * (fell 1.1*x; *",
            "E       ",
            "E       Loss curve (step: loss): *",
            "E       ",
            "E       NeuralDBG found no training fault in this run, and the loss is falling (1.1*x), only not fast "
            "enough for this check: train longer on the batch (more steps) or with a higher learning rate, or lower "
            "the factor.",
        ]
    )


def test_a_loop_that_never_recorded_its_loss_is_told_how_to(result: pytest.RunResult) -> None:
    result.stdout.fnmatch_lines(
        [
            ">       assert_learns(ndbg)",
            "E       pytest_neuraldbg.errors.ArgumentError: assert_learns(): this run recorded no loss, so whether it "
            "learns cannot be judged: no backward pass started from a loss (backward(gradient=...) starts from the "
            "output). Call ndbg.observe_loss(loss) once per step, after computing the loss.",
        ]
    )
