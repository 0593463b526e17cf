"""From events to ranked causal hypotheses: one per underlying fault, root first.

Roots are chosen by what can cause what, then by time and forward order:

1. non-finite values in the input batch (a data problem at that step);
2. the earliest acute failure: an explosion (whose root is the first layer whose activations blow up when it is
   present from the start, else the first exploding layer in forward order) or, when non-finite values come
   first, the place they first appear (the first layer in forward order; the loss; the last layer whose
   gradient is non-finite when they appear in the backward pass);
3. dead units, then saturation (the first affected layer in forward order: downstream layers are its victims);
4. frozen parameters;
5. vanishing gradients nothing else explains (rooted at the most downstream vanishing layer: the gradient
   vanishes from there back to the input);
6. stalled updates (after vanishing gradients, which stall updates by themselves under SGD).

From each root the causal rules collect the events it explains, transitively; claimed events leave the pool and
the next root is chosen among what is left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ..events import EventType, FailureKind, SemanticEvent
from .explain import explain
from .hypothesis import CausalHypothesis, Coupling
from .rules import ONSET_TOLERANCE, CausalRule
from .topology import Topology

Series = Callable[[str, str], list[tuple[int, float]]]

_ORDERED_KINDS = (
    FailureKind.DEAD_NEURONS,
    FailureKind.SATURATED_ACTIVATIONS,
    FailureKind.FROZEN_PARAMETERS,
)


def diagnose(
    events: Sequence[SemanticEvent],
    topo: Topology,
    rules: Sequence[CausalRule],
    series: Series | None = None,
) -> list[CausalHypothesis]:
    """Ranked hypotheses, most likely first; empty when no failure event exists."""
    pool = sorted(events, key=lambda e: (e.step_start, topo.event_position(e)))
    hypotheses: list[CausalHypothesis] = []
    while True:
        found = _next_root(pool, topo)
        if found is None:
            break
        root, kind = found
        chain, couplings = _closure(root, kind, pool, rules, topo)
        if not is_update_surge(root) and not (kind is FailureKind.NON_FINITE and root.event_type is EventType.INPUT):
            claimed_now = {id(e) for e in chain}
            for surge in pool:
                if (
                    is_update_surge(surge)
                    and id(surge) not in claimed_now
                    and surge.step_start <= root.step_start + ONSET_TOLERANCE
                    and surge.step_end >= root.step_start - _SURGE_LOOKBACK
                ):
                    chain.insert(1, surge)
                    couplings.insert(0, Coupling(surge, root, "destabilises"))
                    break
        claimed = {id(e) for e in chain}
        pool = [e for e in pool if id(e) not in claimed]
        confidence = _confidence(root, chain)
        explanation, suggestion = explain(kind, root, chain, topo, series)
        hypotheses.append(CausalHypothesis(kind, confidence, root, chain, explanation, suggestion, couplings))
    hypotheses.sort(key=lambda h: (-h.confidence, h.root.step_start, topo.event_position(h.root)))
    return hypotheses


def _confidence(root: SemanticEvent, chain: list[SemanticEvent]) -> float:
    """The root's own confidence, raised by every other event it explains (agreeing layers)."""
    support = min(len(chain) - 1, 10)
    return round(1 - (1 - root.confidence) * (0.85**support), 3)


def _next_root(pool: Sequence[SemanticEvent], topo: Topology) -> tuple[SemanticEvent, FailureKind] | None:
    root = _pick(pool, topo)
    if root is None:
        # updates as large as the weights that caused nothing else (yet): still a learning rate far too high
        surges = [e for e in pool if is_update_surge(e)]
        return (surges[0], FailureKind.EXPLODING_GRADIENTS) if surges else None
    if root.kind is None:  # activations blowing up from the start: the explosion's origin
        return root, FailureKind.EXPLODING_GRADIENTS
    return root, root.kind


def is_update_surge(e: SemanticEvent) -> bool:
    """Evidence that updates were as large as the weights (a learning rate far too high)."""
    return e.kind is None and e.event_type is EventType.UPDATE and e.to_state == "exploding"


#: How far before a failure an update surge may have ended and still be what set it off.
_SURGE_LOOKBACK = 16


def _pick(pool: Sequence[SemanticEvent], topo: Topology) -> SemanticEvent | None:
    failures = [e for e in pool if e.kind is not None]
    if not failures:
        return None
    by_time = lambda e: (e.step_start, topo.event_position(e))
    inputs = [e for e in failures if e.kind is FailureKind.NON_FINITE and e.event_type is EventType.INPUT]
    if inputs:
        return min(inputs, key=by_time)
    acute = [e for e in failures if e.kind in (FailureKind.EXPLODING_GRADIENTS, FailureKind.NON_FINITE)]
    if acute:
        first = min(e.step_start for e in acute)
        at_first = [e for e in acute if e.step_start == first]
        exploding = [e for e in at_first if e.kind is FailureKind.EXPLODING_GRADIENTS]
        if exploding:
            return _explosion_root(exploding, pool, topo)
        return _non_finite_root(at_first, topo)
    for kind in _ORDERED_KINDS:
        candidates = [e for e in failures if e.kind is kind]
        if candidates:
            return min(candidates, key=by_time)
    vanishing = [e for e in failures if e.kind is FailureKind.VANISHING_GRADIENTS]
    if vanishing:
        first = min(e.step_start for e in vanishing)
        return max((e for e in vanishing if e.step_start == first), key=topo.event_position)
    stalled = [e for e in failures if e.kind is FailureKind.STALLED_UPDATES]
    return min(stalled or failures, key=by_time)  # a kind contributed by a plugin comes last


def _explosion_root(exploding: list[SemanticEvent], pool: Sequence[SemanticEvent], topo: Topology) -> SemanticEvent:
    onset = exploding[0].step_start
    first_in_order = min(exploding, key=topo.event_position)
    amplifying = [e for e in pool if e.kind is None and e.to_state == "amplifying" and e.step_start == topo.first_step]
    if amplifying:  # a layer amplifying its input from the first step: its weights are too large
        return min(amplifying, key=topo.event_position)
    if onset > topo.first_step:
        return first_in_order  # appeared mid-run: the dynamics (learning rate), not one layer's weights
    anomalies = [e for e in pool if e.kind is None and e.to_state == "anomalous" and e.step_start <= onset]
    if not anomalies:
        return first_in_order
    # present from the start with activations blowing up: the first layer whose outputs blow up has weights
    # too large for its input (an activation module that blows up is blamed on the layer feeding it)
    origin = min(anomalies, key=topo.event_position)
    if topo.roles.get(origin.layer) != "parametric":
        feeding = topo.feeding(origin.layer)
        fed = [e for e in anomalies if e.layer == feeding]
        if fed:
            return fed[0]
    return origin


def _non_finite_root(at_first: list[SemanticEvent], topo: Topology) -> SemanticEvent:
    for event_type in (EventType.ACTIVATION, EventType.LOSS):
        found = [e for e in at_first if e.event_type is event_type]
        if found:
            return min(found, key=topo.event_position)
    gradients = [e for e in at_first if e.event_type is EventType.GRADIENT]
    if gradients:  # born in the backward pass, which runs from the last layer to the first
        return max(gradients, key=topo.event_position)
    return min(at_first, key=topo.event_position)


def _closure(
    root: SemanticEvent,
    kind: FailureKind,
    pool: Sequence[SemanticEvent],
    rules: Sequence[CausalRule],
    topo: Topology,
) -> tuple[list[SemanticEvent], list[Coupling]]:
    chain = [root]
    couplings: list[Coupling] = []
    claimed = {id(root)}
    frontier = [root]
    by_kind: dict[FailureKind | None, list[SemanticEvent]] = {}
    for e in pool:
        by_kind.setdefault(e.kind, []).append(e)
    while frontier:
        cause = frontier.pop(0)
        probe = cause
        if cause is root and root.kind is not kind:  # an evidence event standing as the root
            probe = dataclasses.replace(root, kind=kind)
        for rule in rules:
            if rule.cause_kind is not probe.kind:
                continue
            for effect_kind in rule.effect_kinds:
                for effect in by_kind.get(effect_kind, ()):
                    if id(effect) in claimed or not rule.explains(probe, effect, topo):
                        continue
                    claimed.add(id(effect))
                    chain.append(effect)
                    couplings.append(Coupling(cause, effect, rule.relation))
                    frontier.append(effect)
    head, rest = chain[0], chain[1:]
    rest.sort(key=lambda e: (e.step_start, topo.event_position(e)))
    return [head, *rest], couplings
