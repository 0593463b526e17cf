"""From per-step findings to semantic events: persistence, merging and a bounded store.

A *run* is a state holding in one layer over consecutive observations. It becomes a
:class:`~neuraldbg.events.SemanticEvent` once it has held for ``persistence`` observations (or at once when the
evidence is decisive, like a NaN), with the step range it spans. A state present from a layer's first observed
step is an event like any other (``from_state`` is None): faults present from step 0 are the common case.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import DebugConfig
from ..detectors.base import Finding, Observation, TrackKey
from ..events import EventType, FailureKind, SemanticEvent


def normal_state(event_type: EventType) -> str:
    return "healthy" if event_type is EventType.GRADIENT else "normal"


def confidence(strength: float, observations: int, persistence: int, decisive: bool) -> float:
    """Confidence from the evidence: how far past the threshold, and for how long it held."""
    if decisive:
        return round(0.9 + 0.1 * strength, 3)
    support = min(1.0, observations / (2 * persistence))
    return round(min(1.0, 0.45 + 0.35 * strength + 0.2 * support), 3)


@dataclass
class _Run:
    first: Finding
    strongest: Finding
    start: int
    end: int
    count: int
    from_state: str | None
    confirmed: bool = False  # what followed proved it real (an explosion that ends in NaN)
    solid: int = 0  # observations past the full threshold (not provisional)

    @property
    def state(self) -> str:
        return self.first.state

    def extend(self, step: int, finding: Finding) -> None:
        self.end = step
        self.count += 1
        self.solid += not finding.provisional
        if finding.strength > self.strongest.strength or (self.strongest.provisional and not finding.provisional):
            self.strongest = finding

    def qualifies(self, persistence: int, steps: int = 1, ongoing: bool = False) -> bool:
        """Decisive or confirmed evidence, or ``persistence`` solid observations spanning ``steps`` steps (a
        state still holding at the end of the run needs no span: it did not resolve)."""
        if self.first.decisive or self.confirmed:
            return True
        return self.solid >= persistence and (ongoing or self.end - self.start + 1 >= steps)

    def to_event(self, persistence: int, ongoing: bool = False) -> SemanticEvent:
        f = self.strongest
        metrics = dict(f.metrics)
        metrics["observations"] = float(self.count)
        if ongoing:  # still holding at the last observation: nothing seen since says it ended
            metrics["ongoing"] = 1.0
        if f.call:
            metrics["call"] = float(f.call)
        return SemanticEvent(
            event_type=f.event_type,
            kind=f.kind,
            layer=f.layer,
            param=f.param,
            step_start=self.start,
            step_end=self.end,
            from_state=self.from_state,
            to_state=self.state,
            metrics=metrics,
            confidence=confidence(f.strength, self.count, persistence, self.first.decisive),
        )


class EventStore:
    """Events in order of onset, capped at ``cap``: beyond it the earliest and the strongest are kept.

    A new event of the same layer and state that starts within ``merge_gap`` steps of the previous one extends
    it; so does any recurrence once a layer has had ``EPISODES`` separate events in that state (its metric
    ``episodes`` counts them). A layer flapping between states, however long the run, does not grow the store.
    """

    EPISODES = 3

    def __init__(self, cap: int, merge_gap: int) -> None:
        self._cap = cap
        self._merge_gap = merge_gap
        self._entries: list[tuple[TrackKey, SemanticEvent]] = []
        self._latest: dict[TrackKey, int] = {}
        self._episodes: dict[TrackKey, int] = {}
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, key: TrackKey, event: SemanticEvent) -> None:
        idx = self._mergeable(key, event, self._entries, self._latest)
        if idx is not None:
            self._entries[idx] = (key, merge(self._entries[idx][1], event))
            return
        self._episodes[key] = self._episodes.get(key, 0) + 1
        self._entries.append((key, event))
        self._latest[key] = len(self._entries) - 1
        if len(self._entries) > self._cap:
            self._prune()

    def _mergeable(
        self,
        key: TrackKey,
        event: SemanticEvent,
        entries: list[tuple[TrackKey, SemanticEvent]],
        latest: dict[TrackKey, int],
    ) -> int | None:
        idx = latest.get(key)
        if idx is None:
            return None
        prev = entries[idx][1]
        if prev.to_state != event.to_state:
            return None
        close = event.step_start - prev.step_end <= self._merge_gap
        return idx if close or self._episodes.get(key, 0) >= self.EPISODES else None

    def _prune(self) -> None:
        keep = (self._cap * 3) // 4
        by_onset = sorted(range(len(self._entries)), key=lambda i: self._entries[i][1].step_start)
        earliest = set(by_onset[: keep // 2])
        rest = [i for i in by_onset if i not in earliest]
        rest.sort(key=lambda i: -self._entries[i][1].confidence)
        kept = sorted(earliest | set(rest[: keep - len(earliest)]))
        self.dropped += len(self._entries) - len(kept)
        self._entries = [self._entries[i] for i in kept]
        self._latest = {key: i for i, (key, _) in enumerate(self._entries)}

    def events(self, pending: Sequence[tuple[TrackKey, SemanticEvent]] = ()) -> list[SemanticEvent]:
        """The stored events, plus ``pending`` ones merged as :meth:`add` would merge them (nothing is kept)."""
        if not pending:
            return [event for _, event in self._entries]
        entries = list(self._entries)
        latest = dict(self._latest)
        for key, event in pending:
            idx = self._mergeable(key, event, entries, latest)
            if idx is not None:
                entries[idx] = (key, merge(entries[idx][1], event))
                continue
            entries.append((key, event))
            latest[key] = len(entries) - 1
        return [event for _, event in entries]


def merge(prev: SemanticEvent, new: SemanticEvent) -> SemanticEvent:
    stronger = new if new.confidence > prev.confidence else prev
    metrics = dict(stronger.metrics)
    metrics["observations"] = prev.metrics.get("observations", 1.0) + new.metrics.get("observations", 1.0)
    if new.step_start > prev.step_end + 1:
        metrics["episodes"] = prev.metrics.get("episodes", 1.0) + new.metrics.get("episodes", 1.0)
    return dataclasses.replace(
        prev,
        step_end=max(prev.step_end, new.step_end),
        metrics=metrics,
        confidence=max(prev.confidence, new.confidence),
    )


class Tracker:
    """Follows every (detector, layer) over time and emits events into an :class:`EventStore`."""

    def __init__(self, config: DebugConfig) -> None:
        self._persistence = config.persistence
        self._steps = config.persistence_steps
        self._open: dict[TrackKey, _Run] = {}
        self._last: dict[TrackKey, str] = {}
        self._snapshot: list[SemanticEvent] | None = None  # events() until the next update
        self._snapshot_final = False
        # states that began while no other layer was in them: each asks the recorder to observe densely, to date
        # the state and confirm it quickly. A state already open elsewhere (a deep net whose layers cross a
        # threshold one after another) adds nothing a dense window would resolve, and would keep every step full.
        self.started = 0
        self._open_states: dict[tuple[str, str], int] = {}
        self._open_detectors: dict[str, int] = {}
        # a state that returns within this many steps continues its event (a flapping layer is one event)
        self.store = EventStore(config.max_events, merge_gap=max(2 * config.early_every, 8 * config.persistence))

    def update(self, detector: str, step: int, obs: Observation) -> None:
        self._snapshot = None
        if any(f.decisive and f.kind is FailureKind.NON_FINITE for f in obs.findings):
            for open_run in self._open.values():  # non-finite values confirm an explosion under way
                if open_run.state == "exploding":
                    open_run.confirmed = True
        abnormal: set[TrackKey] = set()
        for f in obs.findings:
            key: TrackKey = (detector, f.event_type, f.layer, f.param, f.call)
            abnormal.add(key)
            run: _Run | None = self._open.get(key)
            if run is not None and run.state != f.state:
                # an explosion that turns into another failure (NaN, dead units) set it off: it was real, however
                # short it was before the layer changed state
                run.confirmed = run.confirmed or (run.state == "exploding" and (f.decisive or f.kind is not None))
                self._close(key, run)
                run = None
            if run is None:
                self._open[key] = _Run(f, f, step, step, 1, self._last.get(key), solid=int(not f.provisional))
                state = (detector, f.state)
                opened = self._open_states.get(state, 0)
                self.started += opened == 0
                self._open_states[state] = opened + 1
                self._open_detectors[detector] = self._open_detectors.get(detector, 0) + 1
            else:
                run.extend(step, f)
            self._last[key] = f.state
        last, is_open = self._last, bool(self._open)
        for event_type, layer, param, call in obs.observed:
            key = (detector, event_type, layer, param, call)
            if key in abnormal:
                continue
            if is_open:
                ended = self._open.pop(key, None)
                if ended is not None:
                    self._close(key, ended)
            last[key] = "healthy" if event_type is EventType.GRADIENT else "normal"  # normal_state(), inlined

    def has_open(self, detector: str) -> bool:
        """Whether a state found by ``detector`` is still holding."""
        return self._open_detectors.get(detector, 0) > 0

    def _close(self, key: TrackKey, run: _Run) -> None:
        self._open.pop(key, None)
        self._open_states[(key[0], run.state)] -= 1
        self._open_detectors[key[0]] -= 1
        if run.qualifies(self._persistence, self._steps):
            self.store.add(key, run.to_event(self._persistence))

    def events(self, final: bool = False) -> list[SemanticEvent]:
        """Every event so far, including states still holding, ordered by onset. ``final``: the run is over, so a
        state still holding has held to the end and needs no minimum span. The same list (and the same event
        objects) is returned until the next update."""
        if self._snapshot is not None and self._snapshot_final == final:
            return self._snapshot
        pending = [
            (key, run.to_event(self._persistence, ongoing=True))
            for key, run in self._open.items()
            if run.qualifies(self._persistence, self._steps, ongoing=final)
        ]
        self._snapshot = sorted(self.store.events(pending), key=lambda e: (e.step_start, e.step_end))
        self._snapshot_final = final
        return self._snapshot
