"""Causal rules: which event can explain which.

A rule links a *cause* event to an *effect* event with a relation in words. Rules use forward execution order
and time: a dead or saturated layer explains vanishing gradients *upstream* of it (earlier in forward order)
that start no earlier than it; an explosion explains the non-finite values that follow it. Users add rules
through the ``neuraldbg_causal_rules`` plugin hook (see :mod:`neuraldbg.hookspecs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..events import EventType, FailureKind, SemanticEvent
from .topology import Topology

#: Steps an effect may start before its cause and still be explained by it (detections of different signals
#: can land one or two steps apart).
ONSET_TOLERANCE = 2


@dataclass(frozen=True)
class CausalRule:
    """Base rule: ``cause_kind`` may explain ``effect_kinds`` starting at or after it."""

    name: str
    relation: str
    cause_kind: FailureKind | None
    effect_kinds: tuple[FailureKind | None, ...]
    direction: str = "any"  # "upstream", "downstream", "any", "other" (any other layer)

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        if cause.kind is not self.cause_kind or effect.kind not in self.effect_kinds:
            return False
        if effect.step_start < cause.step_start - ONSET_TOLERANCE or effect.step_end < cause.step_start:
            return False
        here, there = topo.event_position(cause), topo.event_position(effect)
        if self.direction == "upstream":
            return there < here
        if self.direction == "downstream":
            return there > here
        if self.direction == "other":
            return effect.layer != cause.layer or effect.param != cause.param
        return True


@dataclass(frozen=True)
class AnomalyEvidence(CausalRule):
    """Activations blowing up (anomalous or amplifying layers) belong to the explosion that shows them."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        return (
            cause.kind is FailureKind.EXPLODING_GRADIENTS
            and effect.kind is None
            and effect.to_state in ("anomalous", "amplifying")
            and effect.step_end >= cause.step_start - ONSET_TOLERANCE
        )


@dataclass(frozen=True)
class SameFrozenCause(CausalRule):
    """Parameters frozen for the same reason (left out of the optimizer, or lr 0) are one fault."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        return (
            cause.kind is FailureKind.FROZEN_PARAMETERS
            and effect.kind is FailureKind.FROZEN_PARAMETERS
            and cause.metrics.get("in_optimizer") == effect.metrics.get("in_optimizer")
        )


@dataclass(frozen=True)
class NonFiniteAfterwards(CausalRule):
    """Once values are non-finite, later non-finite values (and failures they corrupt) follow from them."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        if cause.kind is not FailureKind.NON_FINITE or effect.kind not in self.effect_kinds:
            return False
        if effect.step_start > cause.step_start:
            return True
        if effect.step_start < cause.step_start:
            return False
        # same step: the forward pass runs input -> layers -> loss, the backward pass after it
        order = {EventType.INPUT: 0, EventType.ACTIVATION: 1, EventType.LOSS: 2, EventType.GRADIENT: 3}
        a, b = order.get(cause.event_type, 4), order.get(effect.event_type, 4)
        if a != b:
            return a < b
        if cause.event_type is EventType.GRADIENT:  # backward runs from the last layer to the first
            return topo.event_position(effect) < topo.event_position(cause)
        return topo.event_position(effect) > topo.event_position(cause)


_V, _E, _D = FailureKind.VANISHING_GRADIENTS, FailureKind.EXPLODING_GRADIENTS, FailureKind.DEAD_NEURONS
_S, _N = FailureKind.SATURATED_ACTIVATIONS, FailureKind.NON_FINITE
_F, _ST = FailureKind.FROZEN_PARAMETERS, FailureKind.STALLED_UPDATES


def builtin_rules() -> list[CausalRule]:
    return [
        CausalRule("dead-zeroes-upstream-gradients", "zeroes the gradient of", _D, (_V,), "upstream"),
        CausalRule("dead-starves-downstream", "starves", _D, (_D, _S), "downstream"),
        CausalRule("saturation-shrinks-upstream-gradients", "shrinks the gradient of", _S, (_V,), "upstream"),
        CausalRule("saturation-propagates", "saturates", _S, (_S,), "downstream"),
        CausalRule("explosion-spreads", "spreads to", _E, (_E,), "other"),
        CausalRule("explosion-overflows", "overflows into", _E, (_N,), "any"),
        CausalRule("explosion-kills-units", "kills units of", _E, (_D,), "any"),
        CausalRule("explosion-saturates", "saturates", _E, (_S,), "any"),
        AnomalyEvidence("explosion-shows-in-activations", "blows up the outputs of", _E, (None,)),
        NonFiniteAfterwards("non-finite-propagates", "propagates to", _N, (_N, _D, _S, _V, _E)),
        CausalRule("vanishing-spreads-upstream", "vanishes further into", _V, (_V,), "upstream"),
        CausalRule("dead-stalls-updates", "stalls", _D, (_ST,), "any"),
        CausalRule("vanishing-stalls-updates", "stalls", _V, (_ST,), "any"),
        SameFrozenCause("frozen-together", "is frozen like", _F, (_F,)),
    ]
