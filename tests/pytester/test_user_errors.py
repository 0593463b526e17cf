"""A mistake in how a test uses the plugin is one message at the test's own line: no plugin frames, no torch
frames, no "During handling of the above exception". Errors from the user's own code keep their traceback."""

from __future__ import annotations

import fnmatch
import re

import pytest

MISTAKES = """
import models
import pytest
import torch
from torch import nn
from pytest_neuraldbg import assert_healthy, assert_learns, assert_no_dead_neurons


def test_no_parameters(neuraldbg):
    neuraldbg.smoke_train(nn.ReLU(), models.data(), models.loss, steps=3)


def test_zero_steps(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=0)


def test_empty_data(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), [], models.loss, steps=3)


def test_batch_of_three(neuraldbg):
    x, y = models.data()[0]
    neuraldbg.smoke_train(models.healthy(), [(x, y, y)], models.loss, steps=3)


def test_optimizer_name(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, optimizer="adam", steps=3)


def test_loss_per_sample(neuraldbg):
    loss = lambda out, target: (out - target) ** 2
    neuraldbg.smoke_train(models.healthy(), models.data(), loss, steps=3)


def test_misspelt_engine_option(neuraldbg):
    neuraldbg(models.healthy(), persistance=3)


def test_unknown_ignored_kind(neuraldbg):
    assert_healthy(neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=3), ignore=["dead"])


def test_max_fraction_too_large(neuraldbg):
    assert_no_dead_neurons(neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=3), max_fraction=2)


def test_factor_below_one(neuraldbg):
    assert_learns(neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=3), factor=0.5)


def test_not_a_debugger():
    assert_healthy("a model")


def test_foreign_run(neuraldbg):
    neuraldbg.assert_matches_baseline(object())


@pytest.mark.neuraldbg(steps="many")
def test_bad_marker(neuraldbg):
    pass
"""

#: The message of each mistake, as pytest prints it under the test's own line.
MESSAGES = {
    "test_no_parameters": "E       pytest_neuraldbg.errors.ArgumentError: smoke_train(): the model (ReLU) has no "
    "parameters (none with requires_grad=True), so there is nothing to train; pass a model with trainable layers",
    "test_zero_steps": "E       pytest_neuraldbg.errors.ArgumentError: smoke_train(): steps must be a positive "
    "integer, got 0",
    "test_empty_data": "E       pytest_neuraldbg.errors.ArgumentError: smoke_train(): data yielded no batches",
    "test_batch_of_three": "E       pytest_neuraldbg.errors.ArgumentTypeError: smoke_train(): each batch must be an "
    "(inputs, targets) pair, got tuple of length 3",
    "test_optimizer_name": "E       pytest_neuraldbg.errors.ArgumentTypeError: smoke_train(): optimizer must be a "
    "torch.optim.Optimizer or a callable params -> optimizer, got str",
    "test_loss_per_sample": "E       pytest_neuraldbg.errors.ArgumentError: smoke_train(): loss_fn must return a "
    "single number (a tensor of one element), got shape (16, 1); reduce it, e.g. with .mean()",
    "test_misspelt_engine_option": "E       neuraldbg.errors.ConfigError: neuraldbg(): unknown option 'persistance' "
    "(did you mean 'persistence'?); expected model, config, preset, plugins, name, grad_scaler, gather, "
    "gather_timeout or a DebugConfig field: *",
    "test_unknown_ignored_kind": "E       pytest_neuraldbg.errors.ArgumentError: assert_healthy(ignore=...): unknown "
    "failure kind 'dead' (did you mean 'dead_neurons'?); expected one of vanishing_gradients, *",
    "test_max_fraction_too_large": "E       pytest_neuraldbg.errors.ArgumentError: assert_no_dead_neurons("
    "max_fraction=...): expected a number in [[]0, 1), got 2",
    "test_factor_below_one": "E       pytest_neuraldbg.errors.ArgumentError: assert_learns(factor=...): expected a "
    "number greater than 1 (2: the loss halves), got 0.5",
    "test_not_a_debugger": "E       pytest_neuraldbg.errors.ArgumentTypeError: assert_healthy(): expected a NeuralDbg "
    "debugger or a trace from neuraldbg.load(), got str",
    "test_foreign_run": "E       pytest_neuraldbg.errors.ArgumentError: assert_matches_baseline(): this debugger was "
    "not created by the neuraldbg fixture; pass name=... to store it under a run name",
}

INTERNALS = re.compile(r"pytest_neuraldbg/\w+\.py|site-packages/torch|neuraldbg/\w+\.py|During handling")


def failure_sections(result: pytest.RunResult) -> dict[str, str]:
    """Each failing or erroring test's section of the output, by test name."""
    text = result.stdout.str()
    body = re.split(r"\n=+ (?:warnings summary|neuraldbg|short test summary info) =+\n", text)[0]
    body = re.sub(r"\n=+ (?:ERRORS|FAILURES) =+\n", "\n", body)
    parts = re.split(r"\n_{3,} (?:ERROR at setup of )?(test_\w+) _{3,}\n", body)
    return dict(zip(parts[1::2], parts[2::2]))


def check_mistakes(result: pytest.RunResult) -> None:
    result.assert_outcomes(failed=len(MESSAGES), errors=1)
    sections = failure_sections(result)
    assert set(sections) == {*MESSAGES, "test_bad_marker"}
    for test, message in MESSAGES.items():
        errors = [ln for ln in sections[test].splitlines() if ln.startswith("E ")]
        assert len(errors) == 1 and fnmatch.fnmatch(errors[0], message), (test, sections[test])  # one message
        assert f"def {test}(" in sections[test]  # the test's own line is shown...
        assert not INTERNALS.search(sections[test]), (test, sections[test])  # ...and nothing below it
    marker = [ln for ln in sections["test_bad_marker"].splitlines() if ln and not ln.startswith("[gw")]
    assert marker == [
        "neuraldbg: marker @pytest.mark.neuraldbg on test_bad_marker: invalid value 'many' for steps: "
        "expected an integer between 1 and 10000000"
    ]  # once: no chained "During handling of the above exception"


def test_each_mistake_is_one_message_at_the_tests_own_line(project: pytest.Pytester) -> None:
    project.makepyfile(test_mistakes=MISTAKES)
    check_mistakes(project.runpytest())


def test_the_same_holds_on_xdist_workers(project: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    project.makepyfile(test_mistakes=MISTAKES)
    result = project.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*2 workers*"])
    check_mistakes(result)


def test_an_error_in_the_users_own_model_keeps_its_traceback(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_model="""
        import models
        import torch
        from torch import nn

        class Broken(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(8, 1)

            def forward(self, x):
                raise RuntimeError("my model is broken")

        def test_broken(neuraldbg):
            neuraldbg.smoke_train(Broken(), models.data(), models.loss, steps=3)
        """
    )
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    # the way from the test to the user's forward, through the training loop, is part of the story
    result.stdout.fnmatch_lines(["*pytest_neuraldbg/smoke.py:*", '*raise RuntimeError("my model is broken")*'])
    result.stdout.fnmatch_lines(["E       RuntimeError: my model is broken"])
