"""The indexed engine against a plain reference, and its cost against the number of events.

The reference below is the engine's documented procedure written the obvious way: choose each root by scanning
every unclaimed event, collect what it explains by trying every rule on every unclaimed event. It is quadratic
and says nothing about speed; it pins down *what* the indexed engine must find. The cost test counts rule
checks (``explains`` calls), which do not depend on the machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from benchmarks.reasoning import counting_checks, events, separate, topology
from neuraldbg.events import EventType, FailureKind, SemanticEvent
from neuraldbg.reasoning import CausalRule, Topology, builtin_rules, diagnose
from neuraldbg.reasoning.engine import _trusted
from neuraldbg.reasoning.rules import is_update_surge, sets_off

K = FailureKind
RUN_ORDER = [
    K.NO_TRAINING_OBSERVED,
    K.NO_GRADIENT,
    K.DEGENERATE_LOSS,
    K.EVAL_MODE_TRAINING,
    K.INCOMPLETE_OBSERVATION,
]
RUN_LEVEL = {*RUN_ORDER, K.LOSS_SCALE_COLLAPSE}  # written out: the oracle does not ask the engine's registry
LR_SENSITIVE = (K.DEAD_NEURONS, K.SATURATED_ACTIVATIONS, K.NON_FINITE, K.EXPLODING_GRADIENTS)
KNOWN = {
    K.EXPLODING_GRADIENTS,
    K.NON_FINITE,
    K.DEAD_NEURONS,
    K.SATURATED_ACTIVATIONS,
    K.FROZEN_PARAMETERS,
    K.VANISHING_GRADIENTS,
    K.STALLED_UPDATES,
}


def reference(
    evs: Sequence[SemanticEvent], topo: Topology, rules: Sequence[CausalRule], lr_at_onset: float | None = None
) -> set[tuple[FailureKind, int, frozenset[int]]]:
    """(kind, root, chain) of every hypothesis, by the slow and obvious procedure."""
    pos = topo.event_position
    pool = sorted(evs, key=lambda e: (e.step_start, pos(e)))
    claimed: set[int] = set()

    def free(e: SemanticEvent) -> bool:
        return id(e) not in claimed

    found = set()
    while True:
        left = [e for e in pool if free(e)]
        root, kind = pick(left, topo)
        if root is None:
            return found
        claimed.add(id(root))
        chain = [root]
        causes = [dataclasses.replace(root, kind=kind) if root.kind is not kind else root]
        lr = root.metrics.get("lr") if is_update_surge(root) else None
        if not is_update_surge(root) and kind not in RUN_LEVEL and root.event_type is not EventType.INPUT:
            trigger = next((s for s in left if is_update_surge(s) and s is not root and sets_off(s, root, topo)), None)
            if trigger is not None:
                lr = trigger.metrics.get("lr")
                claimed.add(id(trigger))
                chain.append(trigger)
            elif root.step_start > topo.first_step and kind in LR_SENSITIVE:
                lr = lr_at_onset
        if lr is not None:
            for s in left:
                if is_update_surge(s) and free(s) and f"{s.metrics.get('lr', 0):.6g}" == f"{lr:.6g}":
                    claimed.add(id(s))
                    chain.append(s)
        causes += chain[1:]
        while causes:
            cause = causes.pop()
            for rule in rules:
                if rule.cause_kind is not cause.kind:
                    continue
                for e in pool:
                    if free(e) and rule.explains(cause, e, topo):
                        claimed.add(id(e))
                        chain.append(e)
                        causes.append(e)
        found.add((kind, id(root), frozenset(id(e) for e in chain)))


def pick(left: list[SemanticEvent], topo: Topology) -> tuple[SemanticEvent | None, FailureKind]:
    pos = topo.event_position

    def first(cands: list[SemanticEvent], key=lambda e: (e.step_start, pos(e))) -> SemanticEvent | None:
        return min(cands, key=key) if cands else None

    failures = [e for e in left if e.kind is not None]
    run = [e for e in failures if e.kind in RUN_LEVEL]
    if run:
        return (r := first(run, lambda e: (e.step_start, RUN_ORDER.index(e.kind), pos(e)))), r.kind  # type: ignore[union-attr]
    inputs = [e for e in failures if e.kind is K.NON_FINITE and e.event_type is EventType.INPUT]
    if inputs:
        return first(inputs), K.NON_FINITE
    acute = [e for e in failures if e.kind in (K.EXPLODING_GRADIENTS, K.NON_FINITE)]
    if acute:
        onset = min(e.step_start for e in acute)
        now = [e for e in acute if e.step_start == onset]
        exploding = [e for e in now if e.kind is K.EXPLODING_GRADIENTS]
        if exploding:
            origin = first(exploding)
            amplifying = [e for e in left if e.kind is None and e.to_state == "amplifying" and e.step_start == 0]
            if amplifying:
                return first(amplifying, lambda e: (pos(e), e.step_start)), K.EXPLODING_GRADIENTS
            if onset > topo.first_step:
                return origin, K.EXPLODING_GRADIENTS
            anomalies = [e for e in left if e.kind is None and e.to_state == "anomalous" and e.step_start <= 0]
            if not anomalies:
                return origin, K.EXPLODING_GRADIENTS
            blown = first(anomalies, lambda e: (pos(e), e.step_start))
            assert blown is not None
            if topo.roles.get(blown.layer) != "parametric":
                fed = [e for e in anomalies if e.layer == topo.feeding(blown.layer)]
                if fed:
                    return first(fed), K.EXPLODING_GRADIENTS
            return blown, K.EXPLODING_GRADIENTS
        for etype in (EventType.ACTIVATION, EventType.LOSS):
            of = [e for e in now if e.event_type is etype]
            if of:
                return first(of), K.NON_FINITE
        backward = [e for e in now if e.event_type is EventType.GRADIENT]
        if backward:
            return first(backward, lambda e: (e.step_start, -pos(e))), K.NON_FINITE
        return first(now), K.NON_FINITE
    for kind in (K.DEAD_NEURONS, K.SATURATED_ACTIVATIONS, K.FROZEN_PARAMETERS):
        of = [e for e in failures if e.kind is kind]
        if of:
            return first(of), kind
    vanishing = [e for e in failures if e.kind is K.VANISHING_GRADIENTS]
    if vanishing:
        return first(vanishing, lambda e: (e.step_start, -pos(e))), K.VANISHING_GRADIENTS
    stalled = [e for e in failures if e.kind is K.STALLED_UPDATES]
    if stalled:
        return first(stalled), K.STALLED_UPDATES
    other = [e for e in failures if e.kind not in KNOWN]
    if other:
        return (o := first(other)), o.kind  # type: ignore[union-attr]
    surges = [e for e in left if is_update_surge(e)]
    return first(surges), K.OVERSIZED_UPDATES  # updates as large as the weights that set nothing off


def engine(
    evs: Sequence[SemanticEvent], topo: Topology, rules: Sequence[CausalRule], lr: float | None = None
) -> set[tuple[FailureKind, int, frozenset[int]]]:
    series = (lambda metric, layer: [(0, lr)] if metric == "lr" else []) if lr is not None else None
    return {(h.kind, id(h.root), frozenset(id(e) for e in h.chain)) for h in diagnose(evs, topo, rules, series)}


@dataclass(frozen=True)
class DeadMakesConstant(CausalRule):
    """A plugin-style rule that overrides ``explains`` alone: the engine must try it on every candidate."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        return cause.kind is K.DEAD_NEURONS and effect.kind is None and effect.layer == cause.layer


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("steps", [60, 400])
@pytest.mark.parametrize("acute", [True, False])
def test_the_indexed_engine_finds_exactly_what_the_plain_procedure_finds(seed, steps, acute):
    n, layers = 400 + 150 * seed, 12 + 3 * seed
    evs = events(n, layers, seed=seed, steps=steps)
    if not acute:  # explosions and non-finite values absorb most of a trace: without them, every rule has work
        evs = [e for e in evs if e.kind not in (K.EXPLODING_GRADIENTS, K.NON_FINITE)]
    topo = topology(layers)
    rules = builtin_rules()
    assert engine(evs, topo, rules) == reference(evs, topo, rules)


@pytest.mark.parametrize("seed", range(4))
def test_with_a_learning_rate_history_and_a_plugin_rule_the_engine_still_matches_the_plain_procedure(seed):
    evs = events(600, 20, seed=100 + seed, steps=120)
    evs += [dataclasses.replace(e, kind=None, to_state="constant") for e in evs if e.kind is K.DEAD_NEURONS][:20]
    topo = topology(20)
    rules = [*builtin_rules(), DeadMakesConstant("dead-makes-constant", "makes constant", K.DEAD_NEURONS, (None,))]
    assert not _trusted(rules[-1]) and all(_trusted(rule) for rule in rules[:-1])
    assert engine(evs, topo, rules, lr=50.0) == reference(evs, topo, rules, lr_at_onset=50.0)


def test_faults_that_explain_nothing_of_each_other_are_each_their_own_hypothesis():
    evs, topo = separate(300)
    found = engine(evs, topo, builtin_rules())
    assert len(found) == 300 and found == reference(evs, topo, builtin_rules())


def test_rule_checks_grow_linearly_with_the_number_of_events():
    """8x the events costs about 8x the rule checks (a quadratic engine: ~64x)."""
    checks = []
    for n in (2000, 16000):
        evs = events(n, n // 20, seed=n)
        with counting_checks() as calls:
            diagnose(evs, topology(n // 20), builtin_rules())
        checks.append(calls[0])
    assert checks[0] >= 2000  # the count is real: at least one check per event
    assert checks[1] / checks[0] < 12
