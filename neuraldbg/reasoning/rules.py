"""Causal rules: which event can explain which.

A rule links a *cause* event to an *effect* event with a relation in words. Rules use forward execution order
and time: a dead or saturated layer, or a frozen one whose weight is all zeros, explains vanishing gradients
*upstream* of it (earlier in forward order) that start no earlier than it; an explosion explains the non-finite
values that follow it. Each kind's room (:mod:`neuraldbg.kinds`) holds the rules in which it is the cause, naming
its effects by the health states they are (``GradientHealth.VANISHING``) rather than by another kind; the registry
resolves them. This module holds the base class and the rules that belong to no one kind: the learning rate's
(updates as large as the weights set off what follows) and the exactly-zero gradients a loss without gradient
leaves. Users add rules through the ``neuraldbg_causal_rules`` plugin hook (see :mod:`neuraldbg.plugins.hookspecs`).

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
from ..health import HealthState, UpdateHealth, is_state
from .topology import Topology

#: Steps an effect may start before its cause and still be explained by it (detections of different signals
#: can land one or two steps apart).
ONSET_TOLERANCE = 2

#: How long after updates as large as the weights ended a failure may begin and still be what they set off.
SURGE_LOOKBACK = 16


def is_update_surge(e: SemanticEvent) -> bool:
    """Updates as large as the weights (median ||dW||/||W|| past ``exploding_update_ratio``): the evidence of a
    learning rate far too high. The one definition the engine and the explanations share."""
    return e.kind is None and e.event_type is EventType.UPDATE and is_state(e.to_state, UpdateHealth.EXPLODING)


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

    An effect is named by its kind, or by a health state that is a kind (``GradientHealth.VANISHING``: the kind's
    room owns its name); ``None`` is kind-less evidence, narrowed by ``effect_states``.

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
    effect_kinds: tuple[FailureKind | HealthState | None, ...]
    direction: str = "any"  # "upstream", "downstream", "any", "other" (any other layer)
    effect_states: tuple[HealthState | str, ...] = ()
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
class ExactlyZeroGradients(CausalRule):
    """A loss that gives no gradient at all explains gradients that are exactly zero (not merely small)."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        zero = effect.metrics.get("exact_zero") == 1.0 or effect.metrics.get("grad_norm") == 0.0
        return zero and super().explains(cause, effect, topo)

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return super().earliest_effect(cause)

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        return super().covers(a, b, topo)


@dataclass(frozen=True)
class ShowsInTheLoss(CausalRule):
    """A fault of kind ``cause_kind`` explains a loss that does not fall as it should (``effect_kinds``: the kinds
    whose findings are the loss's symptoms) if it began before that finding ended: dead units, a frozen layer or
    gradients left unzeroed are why the loss stalls, not another fault. ``late``: kinds whose findings are such a
    symptom only when they began after the cause (a loss that stopped giving gradients in mid-run). One rule per
    kind that is a fault."""

    late: tuple[FailureKind, ...] = ()

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        if cause.kind is not self.cause_kind or effect.kind not in self.effect_kinds:
            return False
        if effect.kind in self.late:
            return cause.step_start < effect.step_start
        return cause.step_start <= effect.step_end

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return None

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        return a.step_start <= b.step_start


#: The relation of a fault to the loss finding it explains.
LOSS_RELATION = "keeps the loss from falling"

#: The relation of updates as large as the weights to a failure they set off.
SETS_OFF = "set off"
