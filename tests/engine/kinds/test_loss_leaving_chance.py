"""A loss that ends in the band of chance and still falls is passing through it only when, at the pace of its second
half, it leaves the band within as many steps again; one that creeps across chance from above by a hundredth of it
per run is stuck there. Losses written by hand, alternating around a straight line: the same on every CPU."""

from __future__ import annotations

import math

from neuraldbg import DebugConfig
from neuraldbg.capture.coverage import Coverage
from neuraldbg.kinds import loss_evidence

STEPS = 400
CLASSES = 24


def run(start: float, end: float, swing: float = 0.002) -> Coverage:
    """A classifier's run of 24 classes whose loss falls linearly from ``start`` to ``end``, each step ``swing``
    above or below the line in turn."""
    coverage = Coverage()
    coverage.training.classes = CLASSES
    for step in range(STEPS):
        coverage.losses.add(step, start + (end - start) * step / STEPS + (swing if step % 2 else -swing))
    return coverage


def curve(start: float, end: float) -> loss_evidence.Curve:
    read = loss_evidence.read(run(start, end), DebugConfig())
    assert read is not None and read.chance == math.log(CLASSES)
    return read


def test_a_loss_creeping_across_chance_from_above_is_stuck_there():
    c = curve(3.27, 3.165)  # log 24 = 3.178
    assert c.at_chance and c.falling  # in the band, still falling with confidence
    assert not loss_evidence.leaving_chance(c)
    found = loss_evidence.finding(run(3.27, 3.165), DebugConfig())
    assert found is not None and found[0] == "loss_at_chance"


def test_a_loss_falling_fast_through_chance_is_passing_through():
    c = curve(3.60, 3.06)  # at this pace it leaves the band (3.02) within another run
    assert c.at_chance and c.falling
    assert loss_evidence.leaving_chance(c)
    found = loss_evidence.finding(run(3.60, 3.06), DebugConfig())
    assert found is None or found[0] != "loss_at_chance"
