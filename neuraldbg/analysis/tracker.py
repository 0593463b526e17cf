"""From per-step findings to semantic events: persistence, merging and a bounded store.

A *run* is a state holding in one layer over consecutive observations. It becomes a
:class:`~neuraldbg.events.SemanticEvent` once it has held for ``persistence`` observations (or at once when the
evidence is decisive, like a NaN), with the step range it spans. A state present from a layer's first observed
step is an event like any other (``from_state`` is None): faults present from step 0 are the common case.

A step is taken whole: the findings of every detector first, then what they saw normal. Detectors of one track
(:attr:`~neuraldbg.detectors.base.Detector.track`) classify one signal: a layer's gradient found non-finite by one
is a change of that gradient's state, not the end of the explosion another was following.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..config import DebugConfig
from ..detectors.base import Finding, Observation, TrackKey
from ..events import FailureKind, SemanticEvent
from ..health import HealthState, is_state, normal_state
from ..kinds import registry
from ..kinds.base import Kind
from .store import EventStore


class _Normals(dict[str, HealthState]):
    """The normal state of each event type met so far (see :func:`normal_state`), looked up once per step and key."""

    def __missing__(self, event_type: str) -> HealthState:
        state = self[event_type] = normal_state(event_type)
        return state


_NORMALS = _Normals()


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
    from_state: HealthState | str | None
    confirmed: bool = False  # what followed proved it real (an explosion that ends in NaN)
    solid: int = 0  # observations past the full threshold (not provisional)
    last_solid: bool = False  # ... the latest one was

    @property
    def state(self) -> HealthState:
        return self.first.state

    def extend(self, step: int, finding: Finding) -> None:
        self.end = step
        self.count += 1
        self.solid += not finding.provisional
        self.last_solid = not finding.provisional
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
        if self.solid < self.count:  # some observations short of the full threshold: how many were past it, and
            metrics["solid"] = float(self.solid)  # whether the latest one was (a state that touched it and fell back)
            metrics["last_solid"] = float(self.last_solid)
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


class Tracker:
    """Follows every tracked signal of every layer over time and emits events into an :class:`EventStore`.

    ``kinds``: the kinds of the run (default: every registered kind), whose rooms say which states a failure that
    follows confirms (an explosion that turns into NaN was real, however short it was) and which findings confirm
    them (a non-finite value).
    """

    def __init__(self, config: DebugConfig, kinds: Iterable[Kind] | None = None) -> None:
        self._persistence = config.persistence
        self._steps = config.persistence_steps
        self._open: dict[TrackKey, _Run] = {}
        self._last: dict[TrackKey, HealthState | str] = {}
        self._snapshot: list[SemanticEvent] | None = None  # events() until the next update
        self._snapshot_final = False
        rooms = registry.rooms() if kinds is None else list(kinds)
        self._confirmable = [s for k in rooms for s in k.confirmed_by_escalation]
        self._confirming: set[FailureKind] = {k.kind for k in rooms if k.confirms_escalation}
        # escalating runs that ended too short to count, each with the step it ended: the failure they cause may
        # begin a step or two after them (units die once the explosion has passed through them)
        self._recent: dict[TrackKey, tuple[_Run, int]] = {}
        # states that began while no other layer was in them, and states first seen past their full threshold
        # while no other layer's was: each asks the recorder to observe densely, to date the state and to confirm
        # it quickly (a layer whose units die slowly crosses the onset level long before the full one; under the
        # sparse schedule its solid readings come one per ``full_every`` steps, too few to confirm it before the
        # run ends). A state already open elsewhere (a deep net whose layers cross a threshold one after another)
        # adds nothing a dense window would resolve, and would keep every step full.
        self.started = 0
        self._open_states: dict[tuple[str, str], int] = {}
        self._solid_states: dict[tuple[str, str], int] = {}  # open runs with a solid observation, per state
        self._open_tracks: dict[str, int] = {}
        # a state that returns within this many steps continues its event (a flapping layer is one event)
        self.store = EventStore(config.max_events, merge_gap=max(2 * config.early_every, 8 * config.persistence))

    def _escalates(self, state: HealthState | str) -> bool:
        """Whether a run in ``state`` is confirmed when a failure follows it (see ``Kind.confirmed_by_escalation``)."""
        return any(is_state(state, s) for s in self._confirmable)

    def update(self, step: int, observations: Sequence[tuple[str, Observation]]) -> None:
        """Take one step's observations, each with the track of the detector that made it."""
        self._snapshot = None
        found: dict[TrackKey, Finding] = {}
        for track, obs in observations:
            for f in obs.findings:
                found.setdefault((track, f.event_type, f.layer, f.param, f.call), f)
        # what an explosion does confirms it: a non-finite value, or units dying or saturating that begin while it
        # lasts or within ``persistence_steps`` of its end (a gradient 1e9 times too large for two steps that
        # kills every ReLU was no transient)
        if self._recent:
            self._recent = {k: (r, end) for k, (r, end) in self._recent.items() if step - end <= self._steps}
        if any(
            f.kind in self._confirming and (f.decisive or (not f.provisional and key not in self._open))
            for key, f in found.items()
        ):
            for open_run in self._open.values():
                if self._escalates(open_run.state):
                    open_run.confirmed = True
            for key, (short, _) in self._recent.items():
                short.confirmed = True
                self.store.add(key, short.to_event(self._persistence))
            self._recent.clear()
        for key, f in found.items():
            run: _Run | None = self._open.get(key)
            if run is not None and run.state != f.state:
                # an explosion that turns into another failure (NaN, dead units) set it off: it was real, however
                # short it was before the layer changed state
                run.confirmed = run.confirmed or (self._escalates(run.state) and (f.decisive or f.kind is not None))
                self._close(key, run)
                run = None
            state = (key[0], f.state)  # a state is a str enum: its member and its string are one key
            was_solid = began = False
            if run is None:
                run = self._open[key] = _Run(
                    f, f, step, step, 1, self._last.get(key), solid=int(not f.provisional), last_solid=not f.provisional
                )
                opened = self._open_states.get(state, 0)
                began = opened == 0
                self.started += began
                self._open_states[state] = opened + 1
                self._open_tracks[key[0]] = self._open_tracks.get(key[0], 0) + 1
            else:
                was_solid = run.solid > 0
                run.extend(step, f)
            run.confirmed = run.confirmed or f.confirms_run
            if run.solid and not was_solid:  # the run is past its full threshold for the first time
                solid = self._solid_states.get(state, 0)
                self.started += solid == 0 and not began  # (a state that begins has asked already)
                self._solid_states[state] = solid + 1
            self._last[key] = f.state
        last, normals = self._last, _NORMALS
        for track, obs in observations:
            if not self._open_tracks.get(track):
                # no run open on this track (so no finding on it at this step either: a finding has opened or
                # extended one above): every key it observed is normal, as below, without looking for a finding or
                # a run that cannot exist (a deep model's tracks observe thousands of keys per step)
                for event_type, layer, param, call in obs.observed:
                    last[(track, event_type, layer, param, call)] = normals[event_type]
                continue
            for event_type, layer, param, call in obs.observed:
                key = (track, event_type, layer, param, call)
                if key in found:
                    continue
                if self._open:
                    ended = self._open.pop(key, None)
                    if ended is not None:
                        self._close(key, ended)
                last[key] = normals[event_type]

    def has_open(self, track: str) -> bool:
        """Whether a state found on ``track`` is still holding."""
        return self._open_tracks.get(track, 0) > 0

    def _close(self, key: TrackKey, run: _Run) -> None:
        self._open.pop(key, None)
        self._open_states[(key[0], run.state)] -= 1
        self._open_tracks[key[0]] -= 1
        if run.solid:
            self._solid_states[(key[0], run.state)] -= 1
        if run.qualifies(self._persistence, self._steps):
            self.store.add(key, run.to_event(self._persistence))
        elif self._escalates(run.state) and run.solid:
            self._recent[key] = (run, run.end)

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
