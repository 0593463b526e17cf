"""``FrozenParameters.undone`` for parameters seen changed out of sight (``Coverage.moved_unseen``): a frozen event is
dropped only while its parameter's last change seen is no further from the last change seen of any parameter than
the longest gap between two of its own changes. The runs in tests/runs/test_optimizer_step_out_of_sight.py reach
the rule through training loops; these pin its boundary, which a loop lands on only by chance."""

from __future__ import annotations

import pytest

from neuraldbg.capture.coverage import Coverage, RunFacts
from neuraldbg.events import EventType, FailureKind, SemanticEvent
from neuraldbg.health import UpdateHealth
from neuraldbg.kinds.frozen_parameters import FrozenParameters

FACTS = RunFacts(trainable=2, backward_passes=40, optimizer_steps=40)


def frozen(param: str = "fc.weight", kind: FailureKind | None = FailureKind.FROZEN_PARAMETERS) -> SemanticEvent:
    """A parameter with a gradient that no optimizer was seen stepping (left out, as read inside the block)."""
    metrics = {"grad_norm": 1.0, "in_optimizer": 0.0, "lr": 0.0}
    return SemanticEvent(EventType.UPDATE, kind, "fc", param, 0, 39, None, UpdateHealth.FROZEN, metrics)


def seen(last: int, gap: int, last_of_any: int, param: str = "fc.weight") -> Coverage:
    """The parameter seen changed last at ``last``, at most ``gap`` readings apart; any parameter last at
    ``last_of_any``."""
    cov = Coverage()
    cov.moved_unseen[param] = (last, gap)
    cov.last_unseen_move = last_of_any
    return cov


@pytest.mark.parametrize(
    ("last", "gap", "last_of_any", "undone"),
    [
        (39, 1, 39, True),  # changed up to the last change seen of any parameter
        (36, 3, 39, True),  # every third reading: its last change one rhythm before the last of any
        (35, 3, 39, False),  # one reading later than its rhythm allows: it stopped while others went on
        (20, 1, 39, False),  # stopped changing at step 20 (a group set to lr 0 mid-run)
    ],
)
def test_a_parameter_changed_out_of_sight_is_not_frozen_only_within_its_rhythm(
    last: int, gap: int, last_of_any: int, undone: bool
):
    assert FrozenParameters().undone(frozen(), seen(last, gap, last_of_any), FACTS) is undone


def test_only_the_parameter_seen_changed_and_only_a_frozen_event_are_dropped():
    cov = seen(39, 1, 39, param="other.weight")
    assert FrozenParameters().undone(frozen(), cov, FACTS) is False  # another parameter moved, not this one
    assert FrozenParameters().undone(frozen(), Coverage(), FACTS) is False  # nothing seen changed out of sight
    assert FrozenParameters().undone(frozen(kind=None), seen(39, 1, 39), FACTS) is False  # not a frozen event
