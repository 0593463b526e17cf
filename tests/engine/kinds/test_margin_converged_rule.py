"""Each clause of the rule that tells a margin loss met on most batches (converged) from a degenerate one, on
gradient readings and losses written by hand: the same on every CPU."""

from __future__ import annotations

from neuraldbg.capture.coverage import Coverage
from neuraldbg.events import FailureKind
from neuraldbg.kinds.base import run_event
from neuraldbg.kinds.degenerate_loss import DegenerateLoss, margin_met

STEPS = 400


def run(first_zero: int = 100, every: int = 5, last_given: int = STEPS - 1, start: float = 0.3, end: float = 0.003):
    """Gradients on every step until ``first_zero``, then exactly zero but on every ``every``-th step up to
    ``last_given``; the losses go from ``start`` to ``end`` by a constant factor per step on the steps with a
    gradient (a margin loss's hard batches near its floor at the end), 0 on the others."""
    coverage = Coverage()
    for step in range(STEPS):
        given = step < first_zero or (step % every == 0 and step <= last_given)
        loss = start * (end / start) ** (step / STEPS) if given else 0.0
        coverage._zero_reading(step, not given, loss)
        coverage.losses.add(step, loss)
        coverage.last_step = step
    return coverage


def learned(first_zero: int, lowest: float, start: float = 0.3) -> Coverage:
    """Gradients on every step until ``first_zero``, the loss falling from ``start`` to ``lowest`` by a constant
    factor per step on them, then exactly zero on every step to the end (every margin of every batch met)."""
    coverage = Coverage()
    for step in range(STEPS):
        given = step < first_zero
        loss = start * (lowest / start) ** (step / (first_zero - 1)) if given else 0.0
        coverage._zero_reading(step, not given, loss)
        coverage.losses.add(step, loss)
        coverage.last_step = step
    return coverage


def test_a_margin_loss_already_near_zero_before_its_gradient_first_vanished_has_converged():
    # a hinge classifier that learned its task: the loss fell to near 0 with a gradient on every step, then every
    # margin was met, early (the losses kept one by one) or late (the blocks), with no hard batch left
    assert margin_met(learned(first_zero=12, lowest=0.001))
    assert margin_met(learned(first_zero=300, lowest=0.001))
    # a policy made deterministic by one step at a rate far too high: its loss had not come near 0 before
    assert not margin_met(learned(first_zero=12, lowest=0.1))
    assert not margin_met(learned(first_zero=300, lowest=0.1))
    assert not margin_met(learned(first_zero=300, lowest=-0.001, start=-0.3))  # a loss below zero has no floor there


def test_a_margin_loss_that_keeps_giving_gradients_on_hard_batches_to_the_end_has_converged():
    assert margin_met(run())


def test_exact_zeros_among_the_first_readings_are_a_loss_that_gave_nothing_from_the_start():
    assert not margin_met(run(first_zero=3))


def test_gradients_on_too_few_batches_after_the_zeros_began_are_not_a_converging_margin():
    coverage = run(every=40)
    assert 0 < coverage.nonzero_after_zero < 0.05 * (coverage.nonzero_after_zero + coverage.zero_gradient_readings)
    assert coverage.last_nonzero_step >= 360
    assert not margin_met(coverage)
    assert margin_met(run(every=15))  # a fifteenth of the batches still hard: converging


def test_gradients_that_stopped_before_the_last_quarter_are_a_policy_made_deterministic():
    assert not margin_met(run(last_given=250))
    assert margin_met(run(last_given=340))


def test_a_loss_that_did_not_fall_to_near_its_floor_has_not_converged():
    # a mask empty on most batches from mid-run: the loss is 0 there, but the batches that still give a gradient
    # keep theirs near where it began, and the run's mean loss, zeros included, fell all the same
    assert not margin_met(run(start=0.3, end=0.25))
    assert not margin_met(run(start=0.3, end=3.0))  # the hard batches' loss grew
    assert not margin_met(run(start=-0.3, end=-0.6))  # a loss below zero has no floor at zero


def test_a_loss_degenerate_on_most_steps_is_not_described_as_zero_on_every_step():
    room = DegenerateLoss()
    most = run_event(FailureKind.DEGENERATE_LOSS, 57, 299, "", steps=300.0, zero_steps=212.0, readings=300.0)
    every = run_event(FailureKind.DEGENERATE_LOSS, 0, 39, "", steps=40.0, zero_steps=40.0, readings=40.0)
    assert room.describe(most) == "exactly zero gradient on 212 of the 300 steps where it was read"
    assert "at every step" in room.describe(every)
