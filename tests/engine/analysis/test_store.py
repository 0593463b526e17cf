"""The event store and the tracker's bookkeeping: merging, episodes, pruning, and what is still open.

These rules decide how many events a run reports and what they say (their step range, observations, episodes,
confidence), and when the recorder observes densely; each test breaks if one of them is inverted or dropped.
"""

from __future__ import annotations

import pytest

from neuraldbg import DebugConfig, EventType, FailureKind, SemanticEvent
from neuraldbg.analysis.store import EventStore, merge
from neuraldbg.analysis.tracker import Tracker
from neuraldbg.detectors.base import Finding, Observation, TrackKey


def dead(layer: str, start: int, end: int, confidence: float = 0.7, **metrics: float) -> SemanticEvent:
    return SemanticEvent(
        event_type=EventType.ACTIVATION,
        kind=FailureKind.DEAD_NEURONS,
        layer=layer,
        param=None,
        step_start=start,
        step_end=end,
        from_state=None,
        to_state="dead",
        metrics={"observations": float(end - start + 1), **metrics},
        confidence=confidence,
    )


def key(layer: str) -> TrackKey:
    return ("dead", EventType.ACTIVATION, layer, None, 0)


# ------------------------------------------------------------------------------------- merging two events


def test_a_merged_event_spans_both_adds_their_observations_and_keeps_the_stronger_ones_metrics():
    weak = dead("3", 0, 9, confidence=0.6, dead_fraction=0.8)  # 10 observations
    strong = dead("3", 10, 14, confidence=0.9, dead_fraction=1.0)  # 5 observations
    for first, second in ((weak, strong), (strong, weak)):
        merged = merge(first, second)
        assert (merged.step_start, merged.step_end) == (first.step_start, 14)
        assert merged.confidence == 0.9
        assert merged.metrics == {"observations": 15.0, "dead_fraction": 1.0}  # contiguous: no episodes


@pytest.mark.parametrize(
    ("second_start", "episodes"),
    [(5, None), (6, 2.0), (40, 2.0)],
    ids=["right after it: one episode", "one step between: two", "far apart: two"],
)
def test_a_merged_event_counts_episodes_only_across_a_gap(second_start: int, episodes: float | None):
    merged = merge(dead("3", 0, 4), dead("3", second_start, second_start + 2))
    assert merged.metrics.get("episodes") == episodes
    assert merged.metrics["observations"] == 8.0


def test_a_merged_event_adds_the_observations_past_the_full_threshold_and_keeps_the_latest_ones_state():
    # 10 observations, 4 past the threshold, the last short of it; 5 observations, all past it (no count written)
    touched = dead("3", 0, 9, confidence=0.9, solid=4.0, last_solid=0.0)
    merged = merge(touched, dead("3", 10, 14, confidence=0.6))
    assert (merged.metrics["solid"], merged.metrics["last_solid"]) == (9.0, 1.0)
    merged = merge(dead("3", 0, 4, confidence=0.9), dead("3", 10, 19, confidence=0.6, solid=4.0, last_solid=0.0))
    assert (merged.metrics["solid"], merged.metrics["last_solid"]) == (9.0, 0.0)


def test_episodes_add_up_over_several_merges():
    merged = merge(merge(dead("3", 0, 4), dead("3", 10, 12)), dead("3", 20, 21))
    assert (merged.metrics["episodes"], merged.metrics["observations"]) == (3.0, 10.0)
    assert (merged.step_start, merged.step_end) == (0, 21)


# ------------------------------------------------------------------------------------- the store


def test_recurrences_within_the_merge_gap_extend_the_event_of_their_own_layer():
    store = EventStore(cap=100, merge_gap=2)
    store.add(key("a"), dead("a", 0, 3))
    store.add(key("b"), dead("b", 1, 4))
    store.add(key("b"), dead("b", 6, 8))  # two steps after b's end
    a, b = store.events()
    assert (a.layer, a.step_start, a.step_end) == ("a", 0, 3)
    assert (b.layer, b.step_start, b.step_end) == ("b", 1, 8)


def test_a_layer_keeps_three_separate_episodes_and_later_ones_extend_the_third():
    store = EventStore(cap=100, merge_gap=2)
    for i in range(5):  # five episodes, each far beyond the merge gap from the last
        store.add(key("3"), dead("3", 10 * i, 10 * i + 3))
    assert [(e.step_start, e.step_end) for e in store.events()] == [(0, 3), (10, 13), (20, 43)]
    assert store.events()[2].metrics["episodes"] == 3.0
    assert EventStore.EPISODES == 3


def test_the_store_holds_max_events_before_it_drops_any():
    store = EventStore(cap=4, merge_gap=0)
    for i in range(4):
        store.add(key(f"layer{i}"), dead(f"layer{i}", 10 * i, 10 * i + 3))
    assert len(store) == 4 and store.dropped == 0
    store.add(key("layer4"), dead("layer4", 40, 43))
    assert len(store) == 3 and store.dropped == 2  # pruned to three quarters of the cap


def test_pruning_keeps_the_event_with_the_earliest_onset_even_when_it_closed_last():
    store = EventStore(cap=4, merge_gap=0)
    for layer, start, confidence in [("a", 50, 0.5), ("b", 60, 0.9), ("c", 70, 0.8), ("early", 0, 0.4)]:
        store.add(key(layer), dead(layer, start, 90, confidence))  # "early" held longest: it closed (and came) last
    store.add(key("d"), dead("d", 80, 90, 0.6))
    assert [e.layer for e in store.events()] == ["b", "c", "early"]  # the earliest onset, then the strongest


# ------------------------------------------------------------------------------------- what is still open

DEAD = Finding(EventType.ACTIVATION, FailureKind.DEAD_NEURONS, "3", "dead", {}, 1.0)
NAN = Finding(EventType.ACTIVATION, FailureKind.NON_FINITE, "3", "non_finite", {}, 1.0, decisive=True)


def observe(tracker: Tracker, step: int, finding: Finding | None, detector: str = "d") -> None:
    obs = Observation()
    obs.saw(EventType.ACTIVATION, "3")
    if finding is not None:
        obs.findings.append(finding)
    tracker.update(step, [(detector, obs)])


def test_a_state_that_ended_asks_for_dense_observation_again_when_it_comes_back():
    tracker = Tracker(DebugConfig())
    for step in range(5):
        observe(tracker, step, DEAD)
    assert tracker.started == 1
    observe(tracker, 5, None)  # it ended
    observe(tracker, 6, DEAD)  # and came back: a new state, worth observing densely again
    assert tracker.started == 2


def test_a_detector_has_an_open_state_exactly_while_one_holds():
    tracker = Tracker(DebugConfig())
    assert not tracker.has_open("d")
    for cycle in range(2):
        observe(tracker, 2 * cycle, NAN)
        assert tracker.has_open("d") and not tracker.has_open("other")
        observe(tracker, 2 * cycle + 1, None)
        assert not tracker.has_open("d")
