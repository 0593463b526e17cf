"""When a loss curve is flat: it fell, with confidence, by less than its batch-to-batch spread, and did not fall
by two standard errors and a tenth of its start (a loss whose batches differ more than its fall can fall by a
third within one spread). Losses written by hand, alternating around a straight line: the same on every CPU."""

from __future__ import annotations

from neuraldbg import DebugConfig
from neuraldbg.capture.coverage import Coverage
from neuraldbg.kinds import loss_evidence

STEPS = 400


def verdict(level: float, fall: float, swing: float) -> loss_evidence.Curve:
    """A loss falling linearly by ``fall`` from ``level`` over the run, each step ``swing`` above or below the line
    in turn (a batch-to-batch spread of swing * sqrt(2))."""
    coverage = Coverage()
    for step in range(STEPS):
        coverage.losses.add(step, level - fall * step / STEPS + (swing if step % 2 else -swing))
    curve = loss_evidence.read(coverage, DebugConfig())
    assert curve is not None
    return curve


def test_a_loss_that_fell_by_a_third_within_one_spread_is_not_flat():
    curve = verdict(10.0, 3.0, 3.0)
    drop = curve.start.mean - curve.end.mean
    assert 0.2 * curve.start.mean < drop < curve.noise  # a fifth of its start or more, less than one spread
    assert curve.verdict == "unclear"


def test_a_confident_fall_of_a_few_percent_within_one_spread_is_flat():
    curve = verdict(10.0, 0.8, 1.0)
    drop = curve.start.mean - curve.end.mean
    error = 2 * curve.noise * (1 / curve.start.n + 1 / curve.end.n) ** 0.5
    assert error < drop < 0.1 * curve.start.mean  # more than two standard errors, less than a tenth of its start
    assert curve.verdict == "flat"


def test_a_loss_that_stays_where_it_began_is_flat_however_much_it_spreads():
    assert verdict(10.0, 0.0, 3.0).verdict == "flat"


def test_a_fall_of_a_tenth_within_two_standard_errors_is_chance_and_flat():
    """A short noisy run with nothing to learn can end a tenth lower by chance (small-batch
    regressions at a learning rate far too low): not evidence of a fall."""
    curve = verdict(10.0, 1.5, 4.0)
    drop = curve.start.mean - curve.end.mean
    error = 2 * curve.noise * (1 / curve.start.n + 1 / curve.end.n) ** 0.5
    assert 0.1 * curve.start.mean < drop < error
    assert curve.verdict == "flat"
