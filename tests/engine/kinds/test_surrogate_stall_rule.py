"""A run too small to train whose loss is a policy-gradient surrogate: its tiny updates are the evidence, whatever
its loss did (a surrogate drifts as the returns do); a supervised loss that climbs under the same updates is not
judged so. Coverage written by hand: the same on every CPU."""

from __future__ import annotations

import math

from neuraldbg.capture.coverage import Coverage
from neuraldbg.config import DebugConfig
from neuraldbg.kinds import stalled_updates
from neuraldbg.stats.training import Row

STEPS = 400


def run(policy_gradient: bool) -> Coverage:
    """Losses climbing from 39 to 41 with a little noise; every step's update 1e-5 of the weights (4e-3 in all)."""
    coverage = Coverage()
    coverage.policy_gradient = policy_gradient
    for step in range(STEPS):
        coverage.losses.add(step, 39.0 + 2.0 * step / STEPS + 0.05 * math.sin(step))
        coverage.training.rows.append(Row(step, 1e-5, 10.0, 1.0, 1.0, math.nan, 1e-6, True))
        coverage.last_step = step
    coverage.steps = STEPS
    return coverage


def test_a_policy_gradient_run_whose_updates_add_up_to_almost_nothing_is_too_small_to_train():
    found = stalled_updates.undertrained(run(policy_gradient=True), DebugConfig())
    assert found is not None and found[0] == "surrogate"


def test_a_supervised_loss_that_climbs_under_the_same_updates_is_not_judged_a_stall():
    assert stalled_updates.undertrained(run(policy_gradient=False), DebugConfig()) is None
