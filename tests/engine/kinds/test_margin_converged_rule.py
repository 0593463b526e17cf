"""Each clause of the rule that tells a margin loss met on most batches (converged) from a degenerate one, on
gradient readings and losses written by hand: the same on every CPU."""

from __future__ import annotations

from neuraldbg import DebugConfig
from neuraldbg.capture.coverage import Coverage
from neuraldbg.events import FailureKind
from neuraldbg.kinds.base import run_event
from neuraldbg.kinds.degenerate_loss import DegenerateLoss, converged

STEPS = 400


def run(first_zero: int = 100, every: int = 5, last_given: int = STEPS - 1, start: float = 0.3, end: float = 0.02):
    """Gradients on every step until ``first_zero``, then exactly zero but on every ``every``-th step up to
    ``last_given``; the losses fall linearly from ``start`` to ``end`` on the steps with a gradient, 0 on the others."""
    coverage = Coverage()
    for step in range(STEPS):
        given = step < first_zero or (step % every == 0 and step <= last_given)
        coverage._zero_reading(step, not given)
        loss = start + (end - start) * step / STEPS
        coverage.losses.add(step, loss if given else 0.0)
        coverage.last_step = step
    return coverage


def test_a_margin_loss_that_keeps_giving_gradients_on_hard_batches_to_the_end_has_converged():
    assert converged(run(), DebugConfig())


def test_exact_zeros_among_the_first_readings_are_a_loss_that_gave_nothing_from_the_start():
    assert not converged(run(first_zero=3), DebugConfig())


def test_gradients_on_too_few_batches_after_the_zeros_began_are_not_a_converging_margin():
    coverage = run(every=40)
    assert 0 < coverage.nonzero_after_zero < 0.05 * (coverage.nonzero_after_zero + coverage.zero_gradient_readings)
    assert coverage.last_nonzero_step >= 360
    assert not converged(coverage, DebugConfig())
    assert converged(run(every=15), DebugConfig())  # a fifteenth of the batches still hard: converging


def test_gradients_that_stopped_before_the_last_quarter_are_a_policy_made_deterministic():
    assert not converged(run(last_given=250), DebugConfig())
    assert converged(run(last_given=340), DebugConfig())


def test_a_loss_that_did_not_fall_to_near_its_floor_has_not_converged():
    assert not converged(run(start=0.3, end=3.0), DebugConfig())  # the hard batches' loss grew
    assert not converged(run(start=-0.3, end=-0.6), DebugConfig())  # a loss below zero has no floor at zero


def test_a_loss_degenerate_on_most_steps_is_not_described_as_zero_on_every_step():
    room = DegenerateLoss()
    most = run_event(FailureKind.DEGENERATE_LOSS, 57, 299, "", steps=300.0, zero_steps=212.0, readings=300.0)
    every = run_event(FailureKind.DEGENERATE_LOSS, 0, 39, "", steps=40.0, zero_steps=40.0, readings=40.0)
    assert room.describe(most) == "exactly zero gradient on 212 of the 300 steps where it was read"
    assert "at every step" in room.describe(every)
