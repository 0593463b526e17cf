"""Which non-finite event explains which: a later step always follows from an earlier one; within one step, the
order the values were computed in (input, forward from the first layer to the last, the loss, then the backward
pass from the last layer to the first). An effect computed before its would-be cause in the same step is not
its effect: the mutation pass found that ``>=`` in place of ``>`` for the step comparison (every same-step pair
explained both ways) passed every test before this file."""

from __future__ import annotations

import pytest

from neuraldbg import EventType, FailureKind, SemanticEvent
from neuraldbg.kinds.non_finite import NonFinite, NonFiniteAfterwards
from neuraldbg.reasoning import Topology

TOPO = Topology(order=["0", "1", "2"], types={"0": "Linear", "1": "ReLU", "2": "Linear"},
                roles={"0": "parametric", "1": "gated", "2": "parametric"})  # fmt: skip
RULE = next(rule for rule in NonFinite().rules() if isinstance(rule, NonFiniteAfterwards))  # the room's own


def nan(event_type: EventType, layer: str, step: int) -> SemanticEvent:
    return SemanticEvent(event_type, FailureKind.NON_FINITE, layer, None, step, step + 5, None, "non_finite",
                         {"nan_count": 1.0}, 1.0)  # fmt: skip


@pytest.mark.parametrize(
    ("cause", "effect", "explained"),
    [
        (nan(EventType.ACTIVATION, "0", 3), nan(EventType.ACTIVATION, "2", 3), True),  # forward: first -> last
        (nan(EventType.ACTIVATION, "2", 3), nan(EventType.ACTIVATION, "0", 3), False),
        (nan(EventType.GRADIENT, "2", 3), nan(EventType.GRADIENT, "0", 3), True),  # backward: last -> first
        (nan(EventType.GRADIENT, "0", 3), nan(EventType.GRADIENT, "2", 3), False),
        (nan(EventType.ACTIVATION, "2", 3), nan(EventType.GRADIENT, "0", 3), True),  # the forward pass comes first
        (nan(EventType.GRADIENT, "0", 3), nan(EventType.ACTIVATION, "2", 3), False),
        (nan(EventType.INPUT, "", 3), nan(EventType.ACTIVATION, "0", 3), True),
        (nan(EventType.GRADIENT, "0", 3), nan(EventType.ACTIVATION, "0", 4), True),  # a later step follows
        (nan(EventType.ACTIVATION, "0", 4), nan(EventType.GRADIENT, "0", 3), False),  # an earlier one never does
    ],
)
def test_within_a_step_only_what_was_computed_later_is_an_effect(
    cause: SemanticEvent, effect: SemanticEvent, explained: bool
) -> None:
    assert RULE.explains(cause, effect, TOPO) is explained
