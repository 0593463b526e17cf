"""From events to ranked causal hypotheses: one per underlying fault, root first.

Roots are chosen by what can cause what, then by time and forward order:

1. run-level findings (no training step observed, no gradient at all, a loss with no gradient, training in
   eval mode, observation that stopped): what they explain would otherwise read as layer failures;
2. non-finite values in the input batch (a data problem at that step);
3. the earliest acute failure: an explosion (whose root is the first layer whose activations blow up when it is
   present from the start, else the first exploding layer in forward order) or, when non-finite values come
   first, the place they first appear (the first layer in forward order; the loss; the last layer whose
   gradient is non-finite when they appear in the backward pass);
4. dead units, then saturation (the first affected layer in forward order: downstream layers are its victims);
5. frozen parameters;
6. vanishing gradients nothing else explains (rooted at the most downstream vanishing layer: the gradient
   vanishes from there back to the input);
7. stalled updates (after vanishing gradients, which stall updates by themselves under SGD), then any other
   kind, then updates as large as the weights that caused nothing else (a learning rate far too high).

From each root the causal rules collect the events it explains, transitively; claimed events leave the pool and
the next root is chosen among what is left. One learning rate is one fault: updates as large as the weights
that came before a failure set it off, every other such surge at the same learning rate joins it, and the
surges explain the other failures they set off. Hypotheses are ranked by tier (nothing can be learned: no
training observed, no gradient, a degenerate loss; then faults; last, an incomplete observation, a caveat),
then confidence, onset and forward order.

Cost: events are sorted once into lanes (:mod:`.index`); each root is the head of a lane; a rule tries a cause
only when no cause it tried before covers it (``CausalRule.covers``), scans candidates from the earliest step an
effect can start, and, for a direction in forward order, asks a range-max tree for the candidates on that side.
With the built-in rules each event is checked about once (1.05 ``explains`` calls per event from 1k to 540k
synthetic events, ``python -m benchmarks.reasoning``); the rest is sorting and tree queries, O(N log N). A plugin
rule that overrides ``explains`` alone is tried for every cause against every candidate of its kinds.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence

from ..events import RUN_LEVEL_KINDS, EventType, FailureKind, SemanticEvent
from .explain import explain
from .hypothesis import CausalHypothesis, Coupling
from .index import Claims, Lane, RangeMax
from .rules import ONSET_TOLERANCE, SETS_OFF, SURGE_LOOKBACK, CausalRule, is_update_surge, same_place
from .topology import Topology

Series = Callable[[str, str], list[tuple[int, float]]]

#: Run-level roots, in the order they are chosen: the first ones make everything after them moot.
_RUN_ORDER = (
    FailureKind.NO_TRAINING_OBSERVED,
    FailureKind.NO_GRADIENT,
    FailureKind.DEGENERATE_LOSS,
    FailureKind.EVAL_MODE_TRAINING,
    FailureKind.INCOMPLETE_OBSERVATION,
)

#: Ranking tiers: nothing can be learned (0), a fault (1), a caveat about what was observed (2).
_TIER = {
    FailureKind.NO_TRAINING_OBSERVED: 0,
    FailureKind.NO_GRADIENT: 0,
    FailureKind.DEGENERATE_LOSS: 0,
    FailureKind.INCOMPLETE_OBSERVATION: 2,
}

#: Failures whose onset in mid-run may come from a learning rate too high (then later surges at the learning
#: rate in force at the onset are the same fault).
_LR_SENSITIVE = (
    FailureKind.DEAD_NEURONS,
    FailureKind.SATURATED_ACTIVATIONS,
    FailureKind.NON_FINITE,
    FailureKind.EXPLODING_GRADIENTS,
)

_KNOWN = frozenset(
    {
        FailureKind.EXPLODING_GRADIENTS,
        FailureKind.NON_FINITE,
        FailureKind.DEAD_NEURONS,
        FailureKind.SATURATED_ACTIVATIONS,
        FailureKind.FROZEN_PARAMETERS,
        FailureKind.VANISHING_GRADIENTS,
        FailureKind.STALLED_UPDATES,
    }
)


def diagnose(
    events: Sequence[SemanticEvent],
    topo: Topology,
    rules: Sequence[CausalRule],
    series: Series | None = None,
) -> list[CausalHypothesis]:
    """Ranked hypotheses, most likely first; empty when no failure event exists."""
    topo = topo.pinned(events)
    pool = _Pool(events, topo)
    closure = _Closure(pool, rules, topo)
    hypotheses: list[CausalHypothesis] = []
    while True:
        found = pool.next_root()
        if found is None:
            break
        root, kind = found
        pool.claim(root)
        chain: list[SemanticEvent] = [root]
        couplings: list[Coupling] = []
        lr = _learning_rate_evidence(root, kind, pool, topo, series, chain, couplings)
        same_lr = pool.surges_with(lr) if lr is not None else None
        if same_lr is not None:  # one learning rate, one fault: its other surges join it
            for i in same_lr.scan():
                pool.claim_index(i)
                chain.append(pool.events[i])
        closure.run(root, kind, chain, couplings, also=chain[1:])  # the surges explain what they set off too
        head, rest = chain[0], chain[1:]
        rest.sort(key=lambda e: (e.step_start, topo.event_position(e)))
        chain = [head, *rest]
        confidence = _confidence(root, chain)
        explanation, suggestion = explain(kind, root, chain, couplings, topo, series)
        hypotheses.append(CausalHypothesis(kind, confidence, root, chain, explanation, suggestion, couplings))
    hypotheses.sort(key=lambda h: (_TIER.get(h.kind, 1), -h.confidence, h.root.step_start, topo.event_position(h.root)))
    return hypotheses


def _confidence(root: SemanticEvent, chain: list[SemanticEvent]) -> float:
    """The root's own confidence, raised by every other event it explains (agreeing layers)."""
    support = min(len(chain) - 1, 10)
    return round(1 - (1 - root.confidence) * (0.85**support), 3)


def _learning_rate_evidence(
    root: SemanticEvent,
    kind: FailureKind,
    pool: _Pool,
    topo: Topology,
    series: Series | None,
    chain: list[SemanticEvent],
    couplings: list[Coupling],
) -> float | None:
    """Attach the update surge that set ``root`` off, if any; return the learning rate a surge must have to be
    part of this fault (None: surges are not this fault's evidence)."""
    if is_update_surge(root):
        return root.metrics.get("lr")
    if kind.run_level or (kind is FailureKind.NON_FINITE and root.event_type is EventType.INPUT):
        return None
    mid_run = root.step_start > topo.first_step
    # the first surge that can have set the root off (rules.sets_off): a failure present from the first step
    # was there before any update
    i = pool.cause_surge(root.step_start + ONSET_TOLERANCE, root.step_start - SURGE_LOOKBACK) if mid_run else None
    if i is not None:
        surge = pool.events[i]
        pool.claim_index(i)
        chain.append(surge)
        couplings.insert(0, Coupling(surge, root, SETS_OFF))
        return surge.metrics.get("lr")
    if mid_run and kind in _LR_SENSITIVE and series is not None:
        points = series("lr", "")
        if points:  # the learning rate in force when the failure began
            return min(points, key=lambda p: (abs(p[0] - root.step_start), p[0]))[1]
    return None


class _Pool:
    """The events not yet claimed by a hypothesis, indexed for root selection and for the rules."""

    def __init__(self, events: Sequence[SemanticEvent], topo: Topology) -> None:
        self.topo = topo
        where = topo.event_position
        self.events = sorted(events, key=lambda e: (e.step_start, where(e)))
        self.position = [where(e) for e in self.events]
        self.index = {id(e): i for i, e in enumerate(self.events)}
        self.claims = Claims(len(self.events))
        first = topo.first_step
        groups: dict[str, list[int]] = {}
        by_kind: dict[tuple[FailureKind | None, str], list[int]] = {}
        anomalous_at: dict[str, list[int]] = {}
        by_lr: dict[float, list[int]] = {}
        for i, e in enumerate(self.events):
            by_kind.setdefault((e.kind, e.to_state if e.kind is None else ""), []).append(i)
            groups.setdefault(_root_group(e, first), []).append(i)
            if e.kind is None and e.to_state == "anomalous" and e.step_start <= first:
                anomalous_at.setdefault(e.layer, []).append(i)
            if is_update_surge(e) and e.metrics.get("lr", 0.0) > 0:
                by_lr.setdefault(_lr_key(e.metrics["lr"]), []).append(i)
        events_, position = self.events, self.position
        run_rank = {k: r for r, k in enumerate(_RUN_ORDER)}
        by_time = lambda i: (events_[i].step_start, position[i])
        by_time_last = lambda i: (events_[i].step_start, -position[i])
        by_run = lambda i: (events_[i].step_start, run_rank.get(events_[i].kind, 9), position[i])  # type: ignore[arg-type]
        lane = self._lane
        self._kinds = {k: lane(m, by_time) for k, m in by_kind.items()}
        self._states: dict[FailureKind | None, list[tuple[str, Lane]]] = {}
        for (k, state), ln in self._kinds.items():
            self._states.setdefault(k, []).append((state, ln))
        self._trees: dict[tuple[FailureKind | None, tuple[str, ...]], RangeMax] = {}
        self.run = lane(groups.get("run", []), by_run)
        self.input = lane(groups.get("input", []), by_time)
        self.non_finite = [  # forward pass first (first layer in order), then the loss, then the backward pass
            lane(groups.get("nf_forward", []), by_time),
            lane(groups.get("nf_loss", []), by_time),
            lane(groups.get("nf_backward", []), by_time_last),
            lane(groups.get("nf_other", []), by_time),
        ]
        self.vanishing = lane(groups.get("vanishing", []), by_time_last)
        self.other = lane(groups.get("other", []), by_time)
        surges = sorted(groups.get("surge", []), key=by_time)
        self.surges = lane(surges, by_time)
        self.surge_ends = RangeMax(
            surges, [events_[i].step_start for i in surges], [events_[i].step_end for i in surges], self.claims
        )
        self.surges_at = {lr: lane(m, by_time) for lr, m in by_lr.items()}
        by_place = lambda i: (position[i], events_[i].step_start)
        self.amplifying_first = lane(groups.get("amplifying_first", []), by_place)
        self.anomalous_first = lane([i for m in anomalous_at.values() for i in m], by_place)
        self.anomalous_at = {layer: lane(m, by_time) for layer, m in anomalous_at.items()}

    def _lane(self, members: list[int], key: Callable[[int], object]) -> Lane:
        members = sorted(members, key=key)  # type: ignore[arg-type]
        return Lane(members, [self.events[i].step_start for i in members], self.claims)

    def lanes(self, kind: FailureKind | None, states: tuple[str, ...] = ()) -> list[Lane]:
        """The lanes (by onset) of events of ``kind`` (evidence: in ``states``, when given)."""
        return [ln for state, ln in self._states.get(kind, ()) if not states or kind is not None or state in states]

    def tree(self, kind: FailureKind | None, states: tuple[str, ...] = ()) -> RangeMax:
        """Events of ``kind`` by forward position, valued by onset (built on first use)."""
        key = (kind, states if kind is None else ())
        tree = self._trees.get(key)
        if tree is None:
            members = sorted(
                (i for ln in self.lanes(kind, states) for i in ln.members),
                key=lambda i: (self.position[i], self.events[i].step_start),
            )
            keys = [self.position[i] for i in members]
            tree = self._trees[key] = RangeMax(members, keys, [self.events[i].step_start for i in members], self.claims)
        return tree

    def claim(self, e: SemanticEvent) -> None:
        self.claims.add(self.index[id(e)])

    def claim_index(self, i: int) -> None:
        self.claims.add(i)

    def _head(self, lane: Lane | None) -> SemanticEvent | None:
        i = lane.first() if lane is not None else None
        return None if i is None else self.events[i]

    def next_root(self) -> tuple[SemanticEvent, FailureKind] | None:
        root = self._pick()
        if root is None:
            # updates as large as the weights that caused nothing else (yet): still a learning rate far too high
            surge = self._head(self.surges)
            return (surge, FailureKind.EXPLODING_GRADIENTS) if surge is not None else None
        if root.kind is None:  # activations blowing up from the start: the explosion's origin
            return root, FailureKind.EXPLODING_GRADIENTS
        return root, root.kind

    def _pick(self) -> SemanticEvent | None:
        for lane in (self.run, self.input):
            head = self._head(lane)
            if head is not None:
                return head
        exploding = self._first_of(FailureKind.EXPLODING_GRADIENTS)
        non_finite = [e for e in map(self._head, self.non_finite) if e is not None]
        firsts = [e.step_start for e in (exploding, *non_finite) if e is not None]
        if firsts:
            first = min(firsts)
            if exploding is not None and exploding.step_start == first:
                return self._explosion_root(exploding)
            return next(e for e in non_finite if e.step_start == first)
        for kind in (FailureKind.DEAD_NEURONS, FailureKind.SATURATED_ACTIVATIONS, FailureKind.FROZEN_PARAMETERS):
            head = self._first_of(kind)
            if head is not None:
                return head
        head = self._head(self.vanishing) or self._first_of(FailureKind.STALLED_UPDATES)
        return head or self._head(self.other)  # a kind this engine does not order comes last

    def _first_of(self, kind: FailureKind) -> SemanticEvent | None:
        return self._head(self._kinds.get((kind, "")))

    def _explosion_root(self, first_in_order: SemanticEvent) -> SemanticEvent:
        """``first_in_order``: the first exploding layer in forward order at the earliest onset."""
        amplifying = self._head(self.amplifying_first)
        if amplifying is not None:  # a layer amplifying its input from the first step: its weights are too large
            return amplifying
        if first_in_order.step_start > self.topo.first_step:
            return first_in_order  # appeared mid-run: the dynamics (learning rate), not one layer's weights
        origin = self._head(self.anomalous_first)
        if origin is None:
            return first_in_order
        # present from the start with activations blowing up: the first layer whose outputs blow up has weights
        # too large for its input (an activation module that blows up is blamed on the layer feeding it)
        if self.topo.roles.get(origin.layer) == "parametric":
            return origin
        feeding = self.topo.feeding(origin.layer)
        fed = self._head(self.anomalous_at.get(feeding)) if feeding is not None else None
        return fed if fed is not None else origin

    def cause_surge(self, latest: int, ends_after: int) -> int | None:
        """The first unclaimed update surge starting at or before ``latest`` and ending at or after
        ``ends_after``."""
        return self.surge_ends.first((0, bisect.bisect_right(self.surge_ends.keys, latest)), ends_after)

    def surges_with(self, lr: float) -> Lane | None:
        return self.surges_at.get(_lr_key(lr))


def _lr_key(lr: float) -> float:
    return float(f"{lr:.6g}")


def _root_group(e: SemanticEvent, first_step: int) -> str:
    """Which root-selection lane an event belongs to ("" for none)."""
    k = e.kind
    if k is None:
        if is_update_surge(e):
            return "surge"
        if e.to_state == "amplifying" and e.step_start == first_step:
            return "amplifying_first"
        return ""
    if k in RUN_LEVEL_KINDS:
        return "run"
    if k is FailureKind.NON_FINITE:
        return {
            EventType.INPUT: "input",
            EventType.ACTIVATION: "nf_forward",
            EventType.LOSS: "nf_loss",
            EventType.GRADIENT: "nf_backward",
        }.get(e.event_type, "nf_other")
    if k is FailureKind.VANISHING_GRADIENTS:
        return "vanishing"
    return "" if k in _KNOWN else "other"


#: Causes a rule remembers having tried: the earliest, which are the most likely to cover the next.
_TRIED = 8

#: A threshold below every onset step.
_NO_BOUND = -(2**62)


class _Closure:
    """Collects what a root explains, transitively, through the causal rules."""

    def __init__(self, pool: _Pool, rules: Sequence[CausalRule], topo: Topology) -> None:
        self.pool = pool
        self.topo = topo
        self.rules = list(rules)
        self.by_cause: dict[FailureKind | None, list[int]] = {}
        for r, rule in enumerate(self.rules):
            self.by_cause.setdefault(rule.cause_kind, []).append(r)
        self.trusted = [_trusted(rule) for rule in self.rules]
        # causes each rule was tried with; claims are final, so a cause covered by one tried before (in this
        # hypothesis or an earlier one) cannot explain anything still unclaimed
        self.tried: list[list[SemanticEvent]] = [[] for _ in self.rules]

    def run(
        self,
        root: SemanticEvent,
        kind: FailureKind,
        chain: list[SemanticEvent],
        couplings: list[Coupling],
        also: Sequence[SemanticEvent] = (),
    ) -> None:
        """Extend ``chain`` and ``couplings`` with what ``root`` (standing for ``kind``) and the events in
        ``also`` (already in the chain) explain, transitively."""
        topo = self.topo
        probe_root = dataclasses.replace(root, kind=kind) if root.kind is not kind else root
        # the root first (what it explains reads as its doing), then the events given, then the rest by onset, the
        # most downstream first: an early cause explains most, so the ones it covers are skipped
        heap: list[tuple[int, int, float, int]] = []
        waiting: list[tuple[SemanticEvent, SemanticEvent]] = []  # (the event, the event as a cause)

        def push(event: SemanticEvent, probe: SemanticEvent, turn: int = 2) -> None:
            heapq.heappush(heap, (turn, probe.step_start, -topo.event_position(probe), len(waiting)))
            waiting.append((event, probe))

        push(root, probe_root, 0)
        for event in also:
            push(event, event, 1)
        while heap:
            cause, probe = waiting[heapq.heappop(heap)[3]]
            for r in self.by_cause.get(probe.kind, ()):
                rule = self.rules[r]
                if self.trusted[r] and not (rule.applies_to(probe) and self._first_try(r, probe)):
                    continue
                for effect in self._explained(r, probe):
                    chain.append(effect)
                    if not (rule.joins or (rule.same_place_joins and same_place(cause, effect))):
                        couplings.append(Coupling(cause, effect, rule.relation))
                    push(effect, effect)

    def _first_try(self, r: int, probe: SemanticEvent) -> bool:
        """Whether ``probe`` may explain something no cause tried before with rule ``r`` would; records it."""
        rule, tried = self.rules[r], self.tried[r]
        if any(rule.covers(done, probe, self.topo) for done in tried):
            return False
        tried[:] = [done for done in tried if not rule.covers(probe, done, self.topo)]
        bisect.insort(tried, probe, key=_onset)
        del tried[_TRIED:]
        return True

    def _explained(self, r: int, probe: SemanticEvent) -> Iterator[SemanticEvent]:
        """Unclaimed events rule ``r`` says ``probe`` explains, each claimed as it is yielded."""
        rule, pool, topo = self.rules[r], self.pool, self.topo
        trusted = self.trusted[r]
        states = rule.effect_states if trusted else ()
        earliest = rule.earliest_effect(probe) if trusted else None
        for effect_kind in rule.effect_kinds:
            if trusted and rule.direction in ("upstream", "downstream"):
                tree = pool.tree(effect_kind, states)
                here = topo.event_position(probe)
                leaves = tree.below(here) if rule.direction == "upstream" else tree.above(here)
                candidates: Iterable[int] = tree.scan(leaves, _NO_BOUND if earliest is None else earliest)
            else:
                candidates = (i for lane in pool.lanes(effect_kind, states) for i in lane.scan(earliest))
            for i in candidates:
                effect = pool.events[i]
                if rule.explains(probe, effect, topo):
                    pool.claim_index(i)
                    yield effect


def _onset(e: SemanticEvent) -> int:
    return e.step_start


def _trusted(rule: CausalRule) -> bool:
    """Whether ``covers`` and ``earliest_effect`` describe this rule's ``explains`` (defined with it or below)."""
    mro = type(rule).__mro__

    def owner(name: str) -> type:
        return next(c for c in mro if name in c.__dict__)

    explains = owner("explains")
    return issubclass(owner("covers"), explains) and issubclass(owner("earliest_effect"), explains)
