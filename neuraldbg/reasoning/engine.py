"""From events to ranked causal hypotheses: one per underlying fault, root first.

Roots are chosen by what can cause what, then by time and forward order. Each kind's room says where its events
stand (:meth:`~neuraldbg.kinds.Kind.lane`); the built-in kinds stand in this order:

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
   kind (a plugin's, unless its room says otherwise), then updates as large as the weights that caused nothing
   else (a learning rate far too high).

From each root the causal rules collect the events it explains, transitively; claimed events leave the pool and
the next root is chosen among what is left. One learning rate is one fault: updates as large as the weights
that came before a failure set it off, every other such surge at the same learning rate joins it, and the
surges explain the other failures they set off. A failure a learning rate too high brings about (dead units,
saturation) that began long after the surges at the learning rate still in force had come and gone is that
learning rate's doing: the hypothesis is then the surges', rooted at the first (:func:`_learning_rate_first`);
so is a loss finding that began no earlier than surges that set nothing else off (:func:`_surge_before_the_loss`).
Hypotheses are ranked by their kind's tier (nothing can be learned: no training observed, no gradient, a degenerate
loss; then faults; last, an incomplete observation, a caveat), then confidence, onset and forward order.

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

from ..events import FailureKind, SemanticEvent
from ..health import HealthState, is_state
from ..kinds import registry
from ..kinds.base import RootLane
from .explain import explain
from .hypothesis import CausalHypothesis, Coupling
from .index import Claims, Lane, RangeMax
from .rules import (
    LOSS_RELATION,
    ONSET_TOLERANCE,
    SETS_OFF,
    SURGE_LOOKBACK,
    CausalRule,
    is_update_surge,
    same_place,
)
from .topology import Topology

Series = Callable[[str, str], list[tuple[int, float]]]


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
        root, kind, chain = _surge_before_the_loss(root, kind, pool, chain, couplings)
        lr = _learning_rate_evidence(root, kind, pool, topo, series, chain, couplings)
        same_lr = pool.surges_with(lr) if lr is not None else None
        if same_lr is not None:  # one learning rate, one fault: its other surges join it
            for i in same_lr.scan():
                pool.claim_index(i)
                chain.append(pool.events[i])
        root, kind, chain = _learning_rate_first(root, kind, chain, couplings)
        closure.run(root, kind, chain, couplings, also=chain[1:])  # the surges explain what they set off too
        head, rest = chain[0], chain[1:]
        rest.sort(key=lambda e: (e.step_start, topo.event_position(e)))
        chain = [head, *rest]
        confidence = _confidence(root, chain)
        explanation, suggestion = explain(kind, root, chain, couplings, topo, series)
        hypotheses.append(CausalHypothesis(kind, confidence, root, chain, explanation, suggestion, couplings))
    hypotheses.sort(
        key=lambda h: (registry.room(h.kind).tier, -h.confidence, h.root.step_start, topo.event_position(h.root))
    )
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
    room = registry.room(kind)
    if not registry.set_off_by_surge(room, root):
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
    if mid_run and room.lr_sensitive and series is not None:
        points = series("lr", "")
        if points:  # the learning rate in force when the failure began
            return min(points, key=lambda p: (abs(p[0] - root.step_start), p[0]))[1]
    return None


def _surge_before_the_loss(
    root: SemanticEvent, kind: FailureKind, pool: _Pool, chain: list[SemanticEvent], couplings: list[Coupling]
) -> tuple[SemanticEvent, FailureKind, list[SemanticEvent]]:
    """The root and kind of the hypothesis: the learning rate's, rooted at the first unclaimed surge, when ``root``
    is a loss finding (its kind's room is a :attr:`~neuraldbg.kinds.Kind.loss_symptom`) and that surge began no
    later than the loss finding did (up to the detection tolerance): updates as large as the weights that made the
    fit worse from the start are why the loss climbs, stops or stays at chance, as any fault that came first is
    (rules.ShowsInTheLoss). Else ``root`` and ``kind`` unchanged. Surges stand after the loss findings among roots
    (they explain the failures of layers first), so this is where they claim the loss they spoilt."""
    if not registry.room(kind).loss_symptom:
        return root, kind, chain
    i = pool.cause_surge(root.step_start + ONSET_TOLERANCE, _NO_BOUND)
    room = registry.room_of(pool.events[i]) if i is not None else None
    if i is None or room is None:
        return root, kind, chain
    surge = pool.events[i]
    pool.claim_index(i)
    couplings.append(Coupling(surge, root, LOSS_RELATION))
    return surge, room.kind, [surge, root]


def _learning_rate_first(
    root: SemanticEvent, kind: FailureKind, chain: list[SemanticEvent], couplings: list[Coupling]
) -> tuple[SemanticEvent, FailureKind, list[SemanticEvent]]:
    """The root and kind of the hypothesis: the learning rate's, rooted at its first surge, when ``root`` is a
    failure a learning rate too high brings about (:attr:`~neuraldbg.kinds.Kind.surge_victim`) that began long
    after surges at the learning rate in force then had come and gone (the chain holds them: they recur at its
    rate, and none set it off); else ``root`` and ``kind`` unchanged.

    A failure that a surge set off (it began while the updates were oversized or right after) stays the
    hypothesis: the layer that broke at that moment is where the damage is, and its explanation names the
    learning rate that set it off. One that began long after is no moment's doing: the updates were oversized,
    and made the fit worse, before it, at the learning rate that was still in force when it began; that
    learning rate is the fault, and the failure one of its consequences."""
    if not registry.room(kind).surge_victim or any(c.relation == SETS_OFF and c.effect is root for c in couplings):
        return root, kind, chain
    first = min((e for e in chain[1:] if is_update_surge(e)), key=lambda e: e.step_start, default=None)
    room = registry.room_of(first) if first is not None and first.step_start <= root.step_start else None
    if first is None or room is None:
        return root, kind, chain
    couplings.insert(0, Coupling(first, root, SETS_OFF))
    return first, room.kind, [first, root, *(e for e in chain[1:] if e is not first)]


class _Pool:
    """The events not yet claimed by a hypothesis, indexed for root selection and for the rules.

    Root selection asks each event's room where it stands (:meth:`~neuraldbg.kinds.Kind.lane`): events that stand
    alike share a lane; lanes are tried by rank, and within a rank the earliest onset wins, then the lower order.
    """

    def __init__(self, events: Sequence[SemanticEvent], topo: Topology) -> None:
        self.topo = topo
        where = topo.event_position
        self.events = sorted(events, key=lambda e: (e.step_start, where(e)))
        self.position = [where(e) for e in self.events]
        self.index = {id(e): i for i, e in enumerate(self.events)}
        self.claims = Claims(len(self.events))
        by_kind: dict[tuple[FailureKind | None, HealthState | str], list[int]] = {}
        by_lane: dict[RootLane, list[int]] = {}
        by_lr: dict[float, list[int]] = {}
        for i, e in enumerate(self.events):
            by_kind.setdefault((e.kind, e.to_state if e.kind is None else ""), []).append(i)
            lane = registry.lane(e)
            if lane is not None:
                by_lane.setdefault(lane, []).append(i)
            if is_update_surge(e) and e.metrics.get("lr", 0.0) > 0:
                by_lr.setdefault(_lr_key(e.metrics["lr"]), []).append(i)
        events_, position = self.events, self.position
        by_time = lambda i: (events_[i].step_start, position[i])
        by_time_last = lambda i: (events_[i].step_start, -position[i])
        self._lanes_by_rank: dict[float, list[tuple[RootLane, Lane]]] = {}
        for spec, members in sorted(by_lane.items(), key=lambda item: (item[0].rank, item[0].order)):
            ordered = self._lane(members, by_time_last if spec.last_first else by_time)
            self._lanes_by_rank.setdefault(spec.rank, []).append((spec, ordered))
        self._kinds = {k: self._lane(m, by_time) for k, m in by_kind.items()}
        self._states: dict[FailureKind | None, list[tuple[HealthState | str, Lane]]] = {}
        for (k, state), ln in self._kinds.items():
            self._states.setdefault(k, []).append((state, ln))
        self._trees: dict[tuple[FailureKind | None, tuple[HealthState | str, ...]], RangeMax] = {}
        self._evidence: dict[tuple[type, str, str | None], Lane] = {}
        surges = sorted((i for i, e in enumerate(events_) if is_update_surge(e)), key=by_time)
        self.surge_ends = RangeMax(
            surges, [events_[i].step_start for i in surges], [events_[i].step_end for i in surges], self.claims
        )
        self.surges_at = {lr: self._lane(m, by_time) for lr, m in by_lr.items()}

    def _lane(self, members: list[int], key: Callable[[int], object]) -> Lane:
        members = sorted(members, key=key)  # type: ignore[arg-type]
        return Lane(members, [self.events[i].step_start for i in members], self.claims)

    def lanes(self, kind: FailureKind | None, states: tuple[HealthState | str, ...] = ()) -> list[Lane]:
        """The lanes (by onset) of events of ``kind`` (evidence: in ``states``, when given)."""
        return [ln for state, ln in self._states.get(kind, ()) if not states or kind is not None or state in states]

    def tree(self, kind: FailureKind | None, states: tuple[HealthState | str, ...] = ()) -> RangeMax:
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
        """The next root cause and the kind of its hypothesis: by rank, the earliest head of that rank's lanes (the
        lower order on a tie), as its room chooses it."""
        for rank in sorted(self._lanes_by_rank):
            heads = [(head, spec.order) for spec, lane in self._lanes_by_rank[rank] if (head := self._head(lane))]
            if not heads:
                continue
            head = min(heads, key=lambda h: (h[0].step_start, h[1]))[0]
            room = registry.room_of(head)
            assert room is not None  # only events a room placed are in a lane
            return registry.choose_root(room, head, self), room.kind
        return None

    def first_evidence(self, state: HealthState, layer: str | None = None) -> SemanticEvent | None:
        """The first unclaimed kind-less event in ``state`` present from the first step: the first in forward order,
        or the first in time in ``layer`` when given (see :class:`~neuraldbg.kinds.base.RootPool`)."""
        key = (type(state), str(state.value), layer)
        lane = self._evidence.get(key)
        if lane is None:
            first = self.topo.first_step
            members = [
                i
                for i, e in enumerate(self.events)
                if e.kind is None
                and is_state(e.to_state, state)
                and e.step_start <= first
                and (layer is None or e.layer == layer)
            ]
            if layer is None:
                lane = self._lane(members, lambda i: (self.position[i], self.events[i].step_start))
            else:
                lane = self._lane(members, lambda i: (self.events[i].step_start, self.position[i]))
            self._evidence[key] = lane
        return self._head(lane)

    def cause_surge(self, latest: int, ends_after: int) -> int | None:
        """The first unclaimed update surge starting at or before ``latest`` and ending at or after
        ``ends_after``."""
        return self.surge_ends.first((0, bisect.bisect_right(self.surge_ends.keys, latest)), ends_after)

    def surges_with(self, lr: float) -> Lane | None:
        return self.surges_at.get(_lr_key(lr))


def _lr_key(lr: float) -> float:
    return float(f"{lr:.6g}")


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
            if isinstance(effect_kind, HealthState):
                continue  # a state the registry did not resolve to a kind: no event is of it
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


#: :func:`_trusted` of each rule class met (it depends on the class alone).
_TRUSTED: dict[type, bool] = {}


def _trusted(rule: CausalRule) -> bool:
    """Whether ``covers`` and ``earliest_effect`` describe this rule's ``explains`` (defined with it or below)."""
    cls = type(rule)
    found = _TRUSTED.get(cls)
    if found is None:
        found = _TRUSTED[cls] = _describes_explains(cls)
    return found


def _describes_explains(cls: type) -> bool:
    mro = cls.__mro__

    def owner(name: str) -> type:
        return next(c for c in mro if name in c.__dict__)

    explains = owner("explains")
    return issubclass(owner("covers"), explains) and issubclass(owner("earliest_effect"), explains)
