"""``OversizedUpdates.undone``: large updates confirmed by a rise of the loss are undone only by a last quarter of
the run that lies wholly after them and averages at most a tenth of where the loss stood before them, and below it
by more than the loss's batch-to-batch spread."""

from __future__ import annotations

import pytest

from neuraldbg.capture.coverage import Coverage, RunFacts
from neuraldbg.events import EventType, SemanticEvent
from neuraldbg.health import UpdateHealth
from neuraldbg.kinds.oversized_updates import OversizedUpdates

STEPS = 200


def surge(start: int, end: int, **metrics: float) -> SemanticEvent:
    return SemanticEvent(EventType.UPDATE, None, "", None, start, end, None, UpdateHealth.EXPLODING, dict(metrics))


def coverage(losses: list[float]) -> Coverage:
    cov = Coverage()
    for step, loss in enumerate(losses):
        cov.losses.add(step, loss)
    return cov


def falling(end: float) -> list[float]:
    """8 at first, 16 over steps 10-16 (the rise), then down to ``end``, with a batch-to-batch wobble of +-0.3."""
    out = []
    for step in range(STEPS):
        level = 8.0 if step < 10 else 16.0 if step <= 16 else max(end, 16.0 - (step - 16) * 0.2)
        out.append(level + (0.3 if step % 2 else -0.3))
    return out


def thrown_up() -> list[float]:
    """0.3 at first, 7 over steps 10-16, then 0.02 with a wobble of +-0.005: spread ~0.5 from the two jumps."""
    out = []
    for step in range(STEPS):
        level = 0.3 if step < 10 else 7.0 if step <= 16 else 0.02
        out.append(level + (0.005 if step % 2 else -0.005))
    return out


FACTS = RunFacts(trainable=5, backward_passes=STEPS, optimizer_steps=STEPS)


@pytest.mark.parametrize(
    ("losses", "event", "undone"),
    [
        # the rise more than undone: the last quarter far below 8, after the surge
        (falling(0.5), surge(10, 16, loss_before=8.0, loss_during=16.0), True),
        # trained, but the last quarter only a little below where it stood before the surge (a learning rate 100x
        # too high: 0.66-0.93 of it): the harm stays
        (falling(7.9), surge(10, 16, loss_before=8.0, loss_during=16.0), False),
        (falling(1.0), surge(10, 16, loss_before=8.0, loss_during=16.0), False),
        # a tenth of it, just: undone
        (falling(0.79), surge(10, 16, loss_before=8.0, loss_during=16.0), True),
        # a surge that threw the loss 20x up: a tenth of where it stood, but its spread dwarfs that
        (thrown_up(), surge(10, 16, loss_before=0.3, loss_during=7.0), False),
        # the surge reaches into the last quarter: nothing after it to undo it
        (falling(0.5), surge(10, 160, loss_before=8.0, loss_during=16.0), False),
        # confirmed by the updates alone (no loss before it): not judged on the loss
        (falling(0.5), surge(10, 16), False),
        # not a surge: another room's event
        (
            falling(0.5),
            SemanticEvent(EventType.UPDATE, None, "", None, 10, 16, None, UpdateHealth.STALLED, {"loss_before": 8.0}),
            False,
        ),
    ],
)
def test_large_updates_are_undone_only_by_a_later_loss_far_below_where_it_stood_before(
    losses: list[float], event: SemanticEvent, undone: bool
) -> None:
    assert OversizedUpdates().undone(event, coverage(losses), FACTS) is undone


def test_a_run_too_short_to_read_its_curve_undoes_nothing() -> None:
    event = surge(10, 16, loss_before=8.0, loss_during=16.0)
    assert OversizedUpdates().undone(event, coverage(falling(0.5)[:40]), FACTS) is False
