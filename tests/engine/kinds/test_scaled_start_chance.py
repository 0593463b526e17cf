"""A cross-entropy whose first loss lies far above chance (logits scaled up at the start: a temperature, a margin's
scale) is still judged at chance when it only shed that start and ended at log(classes), not when it fell far from
it (a margin moves where its floor is). Losses written by hand: the same on every CPU."""

from __future__ import annotations

import math

from neuraldbg import DebugConfig
from neuraldbg.capture.coverage import Coverage
from neuraldbg.kinds import loss_evidence

STEPS = 300


def curve(classes: int, first: float, end: float) -> loss_evidence.Curve:
    """A classifier's run whose labels were read (a known cross-entropy): the loss falls from ``first`` to ``end``
    over the first third of the run, then stays there, alternating by 0.01 around it."""
    coverage = Coverage()
    coverage.training.classes = coverage.label_classes = classes
    for step in range(STEPS):
        level = first + (end - first) * min(1.0, 3 * step / STEPS)
        coverage.losses.add(step, level + (0.01 if step % 2 else -0.01))
    read = loss_evidence.read(coverage, DebugConfig())
    assert read is not None and read.scaled_start and read.chance == math.log(classes)
    return read


def test_a_loss_that_only_shed_its_scaled_start_and_ends_at_chance_is_at_chance():
    assert curve(64, 5.9, 4.12).at_chance  # a CLIP given shuffled pairs: its temperature shed, log 64 = 4.16


def test_a_loss_that_fell_far_from_its_scaled_start_is_not_judged_at_chance():
    assert not curve(10, 6.9, 2.25).at_chance  # a CosFace margin near log 10 = 2.30 while it learns
