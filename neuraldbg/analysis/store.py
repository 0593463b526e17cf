"""The events of a run, in order of onset, in bounded memory: recurrences merged, the store capped."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..detectors.base import TrackKey
from ..events import SemanticEvent


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
    if "solid" in prev.metrics or "solid" in new.metrics:  # observations past the full threshold, over the episodes
        metrics["solid"] = sum(e.metrics.get("solid", e.metrics.get("observations", 1.0)) for e in (prev, new))
        metrics["last_solid"] = new.metrics.get("last_solid", 1.0)
    if new.step_start > prev.step_end + 1:
        metrics["episodes"] = prev.metrics.get("episodes", 1.0) + new.metrics.get("episodes", 1.0)
    return dataclasses.replace(
        prev,
        step_end=max(prev.step_end, new.step_end),
        metrics=metrics,
        confidence=max(prev.confidence, new.confidence),
    )
