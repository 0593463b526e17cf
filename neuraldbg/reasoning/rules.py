"""Causal rules: which event can explain which.

A rule links a *cause* event to an *effect* event with a relation in words. Rules use forward execution order
and time: a dead or saturated layer, or a frozen one whose weight is all zeros, explains vanishing gradients
*upstream* of it (earlier in forward order) that start no earlier than it; an explosion explains the non-finite
values that follow it. Users add rules through the ``neuraldbg_causal_rules`` plugin hook (see
:mod:`neuraldbg.plugins.hookspecs`).

Not every rule is a cause and an effect. Some say that two events are *one fault* (parameters frozen for the
same reason; a layer's later state in the same layer): the effect then joins the hypothesis without a causal
link, so no explanation reads "'fc2.weight' is frozen like 'fc2.bias'" or "'0' blows up the outputs of '0'".

Two optional methods let the engine skip work without changing what is explained: ``earliest_effect`` (no
effect starts before this step) and ``covers`` (every effect one cause explains, another explains too). The
engine trusts them only when the class that defines ``explains`` defines them as well, so a plugin rule that
overrides ``explains`` alone is always checked against every candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..events import EventType, FailureKind, SemanticEvent
from .topology import Topology

#: Steps an effect may start before its cause and still be explained by it (detections of different signals
#: can land one or two steps apart).
ONSET_TOLERANCE = 2

#: How long after updates as large as the weights ended a failure may begin and still be what they set off.
SURGE_LOOKBACK = 16


def is_update_surge(e: SemanticEvent) -> bool:
    """Updates as large as the weights (median ||dW||/||W|| past ``exploding_update_ratio``): the evidence of a
    learning rate far too high. The one definition the engine and the explanations share."""
    return e.kind is None and e.event_type is EventType.UPDATE and e.to_state == "exploding"


def sets_off(surge: SemanticEvent, failure: SemanticEvent, topo: Topology) -> bool:
    """Whether updates as large as the weights can have set ``failure`` off: it began in mid-run (a failure
    present from the first step was there before any update), no earlier than the surge (up to the detection
    tolerance), and no later than ``SURGE_LOOKBACK`` steps after it ended."""
    return (
        failure.step_start > topo.first_step
        and surge.step_start <= failure.step_start + ONSET_TOLERANCE
        and failure.step_start <= surge.step_end + SURGE_LOOKBACK
    )


def same_place(a: SemanticEvent, b: SemanticEvent) -> bool:
    """Whether two events are about the same thing (same layer and parameter, or the same model-wide signal)."""
    return a.where == b.where


@dataclass(frozen=True)
class CausalRule:
    """Base rule: ``cause_kind`` may explain ``effect_kinds`` starting at or after it.

    ``direction`` places the effect in forward order relative to the cause: ``"upstream"`` (earlier),
    ``"downstream"`` (later), ``"other"`` (any other layer or parameter) or ``"any"``; a subclass that defines
    ``covers`` keeps its effects in that direction. ``effect_states``: when set, only effects in these states
    (``to_state``). ``joins``: the effect is part of the cause's fault rather than its consequence (grouped in
    the chain, no coupling). ``same_place_joins``: an effect in the same place as its cause (the same layer's
    later state) is grouped rather than linked; the built-in rules set it, a plugin rule links whatever it
    explains.
    """

    name: str
    relation: str
    cause_kind: FailureKind | None
    effect_kinds: tuple[FailureKind | None, ...]
    direction: str = "any"  # "upstream", "downstream", "any", "other" (any other layer)
    effect_states: tuple[str, ...] = ()
    joins: bool = False
    same_place_joins: bool = False

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        if cause.kind is not self.cause_kind or effect.kind not in self.effect_kinds:
            return False
        if self.effect_states and effect.to_state not in self.effect_states:
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

    def applies_to(self, cause: SemanticEvent) -> bool:
        """Whether ``cause`` can explain anything under this rule (else its candidates are not even looked at)."""
        return cause.kind is self.cause_kind

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        """No effect of ``cause`` starts before this step (None: no bound)."""
        return cause.step_start - ONSET_TOLERANCE

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        """Whether ``a`` explains every event ``b`` explains (then ``b`` need not be tried as a cause)."""
        if a.step_start > b.step_start:
            return False
        if self.direction == "upstream":
            return topo.event_position(a) >= topo.event_position(b)
        if self.direction == "downstream":
            return topo.event_position(a) <= topo.event_position(b)
        if self.direction == "other":
            return a.layer == b.layer and a.param == b.param
        return True


@dataclass(frozen=True)
class AnomalyEvidence(CausalRule):
    """Activations blowing up (anomalous or amplifying layers) belong to the explosion that shows them."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        return (
            cause.kind is FailureKind.EXPLODING_GRADIENTS
            and effect.kind is None
            and effect.to_state in self.effect_states
            and effect.step_end >= cause.step_start - ONSET_TOLERANCE
        )

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return None  # a layer may have been blowing up before its gradients crossed the threshold

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        return a.step_start <= b.step_start


@dataclass(frozen=True)
class InflatedUpdates(CausalRule):
    """Exploding gradients make the updates as large as the weights (an update surge that starts with or after
    the explosion is its consequence, not a learning rate too high)."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        return (
            cause.kind is FailureKind.EXPLODING_GRADIENTS
            and is_update_surge(effect)
            and effect.step_start >= cause.step_start
        )

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return cause.step_start

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        return a.step_start <= b.step_start


@dataclass(frozen=True)
class SurgeSetsOff(CausalRule):
    """Updates as large as the weights (a learning rate far too high) set off the failures that begin in mid-run
    while they last or soon after: units dying, saturating, gradients exploding, values overflowing."""

    def applies_to(self, cause: SemanticEvent) -> bool:
        return is_update_surge(cause)

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        return is_update_surge(cause) and effect.kind in self.effect_kinds and sets_off(cause, effect, topo)

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return cause.step_start - ONSET_TOLERANCE

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        return a.step_start <= b.step_start and a.step_end >= b.step_end


@dataclass(frozen=True)
class SameFrozenCause(CausalRule):
    """Parameters frozen for the same reason (left out of the optimizer, or lr 0) are one fault."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        return (
            cause.kind is FailureKind.FROZEN_PARAMETERS
            and effect.kind is FailureKind.FROZEN_PARAMETERS
            and cause.metrics.get("in_optimizer") == effect.metrics.get("in_optimizer")
        )

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return None

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        return a.metrics.get("in_optimizer") == b.metrics.get("in_optimizer")


@dataclass(frozen=True)
class FrozenZeroWeightBlocks(CausalRule):
    """A frozen layer whose weight is all zeros passes no gradient to its input, and never will: the exactly-zero
    gradients upstream of it (earlier in forward order) are its effect (a zero-initialised head left out of the
    optimizer)."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        if cause.metrics.get("zero_weight") != 1.0:
            return False
        zero = effect.metrics.get("exact_zero") == 1.0 or effect.metrics.get("grad_norm") == 0.0
        return zero and super().explains(cause, effect, topo)

    def applies_to(self, cause: SemanticEvent) -> bool:
        return cause.kind is self.cause_kind and cause.metrics.get("zero_weight") == 1.0

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return super().earliest_effect(cause)

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        blocks = a.metrics.get("zero_weight") == 1.0 or b.metrics.get("zero_weight") != 1.0
        return blocks and super().covers(a, b, topo)


#: Order of events within one step: the forward pass runs input -> layers -> loss, the backward pass after it.
_STEP_ORDER = {EventType.INPUT: 0, EventType.ACTIVATION: 1, EventType.LOSS: 2, EventType.GRADIENT: 3}


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
        a, b = _STEP_ORDER.get(cause.event_type, 4), _STEP_ORDER.get(effect.event_type, 4)
        if a != b:
            return a < b
        if cause.event_type is EventType.GRADIENT:  # backward runs from the last layer to the first
            return topo.event_position(effect) < topo.event_position(cause)
        return topo.event_position(effect) > topo.event_position(cause)

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return cause.step_start

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        if a.step_start != b.step_start:
            return a.step_start < b.step_start
        ta, tb = _STEP_ORDER.get(a.event_type, 4), _STEP_ORDER.get(b.event_type, 4)
        if ta != tb:
            return ta < tb
        here, there = topo.event_position(a), topo.event_position(b)
        return here >= there if a.event_type is EventType.GRADIENT else here <= there


@dataclass(frozen=True)
class ExactlyZeroGradients(CausalRule):
    """A loss that gives no gradient at all explains gradients that are exactly zero (not merely small)."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        zero = effect.metrics.get("exact_zero") == 1.0 or effect.metrics.get("grad_norm") == 0.0
        return zero and super().explains(cause, effect, topo)

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return super().earliest_effect(cause)

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        return super().covers(a, b, topo)


_V, _E, _D = FailureKind.VANISHING_GRADIENTS, FailureKind.EXPLODING_GRADIENTS, FailureKind.DEAD_NEURONS
_S, _N = FailureKind.SATURATED_ACTIVATIONS, FailureKind.NON_FINITE
_F, _ST = FailureKind.FROZEN_PARAMETERS, FailureKind.STALLED_UPDATES
_DL, _NG = FailureKind.DEGENERATE_LOSS, FailureKind.NO_GRADIENT
_BLOW_UP = ("anomalous", "amplifying")

#: The relation of updates as large as the weights to a failure they set off.
SETS_OFF = "set off"


def builtin_rules() -> list[CausalRule]:
    """The built-in rules. None of them links two events in the same place: those are one fault."""

    def rule(
        cls: type[CausalRule],
        name: str,
        relation: str,
        cause: FailureKind | None,
        effects: tuple[FailureKind | None, ...],
        direction: str = "any",
        states: tuple[str, ...] = (),
    ) -> CausalRule:
        return cls(name, relation, cause, effects, direction, states, same_place_joins=True)

    base = CausalRule
    return [
        # run-level roots: a loss that gives no gradient explains the zero gradients and the stillness it causes
        rule(ExactlyZeroGradients, "degenerate-loss-zeroes-gradients", "zeroes the gradient of", _DL, (_V,)),
        rule(base, "degenerate-loss-stops-updates", "stops", _DL, (_ST,)),
        rule(base, "degenerate-loss-freezes", "stops the updates of", _DL, (_F,)),
        rule(ExactlyZeroGradients, "no-gradient-zeroes-gradients", "leaves no gradient for", _NG, (_V,)),
        rule(base, "no-gradient-stops-updates", "stops", _NG, (_ST,)),
        # layer-level
        rule(base, "dead-zeroes-upstream-gradients", "zeroes the gradient of", _D, (_V,), "upstream"),
        rule(FrozenZeroWeightBlocks, "frozen-zero-weight-blocks", "zeroes the gradient of", _F, (_V,), "upstream"),
        rule(base, "dead-starves-downstream", "starves", _D, (_D, _S), "downstream"),
        rule(base, "saturation-shrinks-upstream-gradients", "shrinks the gradient of", _S, (_V,), "upstream"),
        rule(base, "saturation-propagates", "saturates", _S, (_S,), "downstream"),
        rule(base, "explosion-spreads", "spreads to", _E, (_E,)),
        rule(base, "explosion-overflows", "overflows into", _E, (_N,)),
        rule(base, "explosion-kills-units", "kills units of", _E, (_D,)),
        rule(base, "explosion-saturates", "saturates", _E, (_S,)),
        rule(
            AnomalyEvidence, "explosion-shows-in-activations", "blows up the outputs of", _E, (None,), "any", _BLOW_UP
        ),
        rule(InflatedUpdates, "explosion-inflates-updates", "inflates", _E, (None,), "any", ("exploding",)),
        rule(SurgeSetsOff, "surge-sets-off", SETS_OFF, None, (_D, _S, _E, _N)),
        rule(NonFiniteAfterwards, "non-finite-propagates", "propagates to", _N, (_N, _D, _S, _V, _E)),
        rule(base, "vanishing-spreads-upstream", "vanishes further into", _V, (_V,), "upstream"),
        rule(base, "dead-stalls-updates", "stalls", _D, (_ST,)),
        rule(base, "vanishing-stalls-updates", "stalls", _V, (_ST,)),
        SameFrozenCause("frozen-together", "is frozen like", _F, (_F,), joins=True),
    ]
