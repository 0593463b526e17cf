"""Persistence, merging of consecutive steps, and the bounded event store."""

from __future__ import annotations

import dataclasses
import itertools

import support
import torch
from torch import nn

from neuraldbg import DebugConfig, EventType, FailureKind
from neuraldbg.analysis.tracker import Tracker
from neuraldbg.detectors.base import Finding, Observation
from neuraldbg.stats.history import Series

DEAD = Finding(EventType.ACTIVATION, FailureKind.DEAD_NEURONS, "3", "dead", {"dead_fraction": 1.0}, 1.0)
NAN = Finding(EventType.ACTIVATION, FailureKind.NON_FINITE, "3", "non_finite", {}, 1.0, decisive=True)


def feed(tracker: Tracker, states: list[Finding | None], start: int = 0) -> None:
    for step, finding in enumerate(states, start=start):
        obs = Observation()
        obs.saw(EventType.ACTIVATION, "3")
        if finding is not None:
            obs.findings.append(finding)
        tracker.update(step, [("d", obs)])


def test_a_state_present_from_the_first_step_is_an_event_with_no_from_state():
    tracker = Tracker(DebugConfig())
    feed(tracker, [DEAD] * 5)
    (event,) = tracker.events()
    assert (event.step_start, event.step_end, event.from_state, event.to_state) == (0, 4, None, "dead")
    assert event.metrics["observations"] == 5


def test_an_event_with_observations_short_of_the_full_threshold_counts_those_past_it_and_the_latest():
    short = dataclasses.replace(DEAD, provisional=True)
    tracker = Tracker(DebugConfig(persistence=2))
    feed(tracker, [short, DEAD, DEAD, DEAD, short, short])
    (event,) = tracker.events(final=True)
    assert (event.metrics["observations"], event.metrics["solid"], event.metrics["last_solid"]) == (6, 3, 0.0)
    tracker = Tracker(DebugConfig(persistence=2))
    feed(tracker, [short, DEAD, DEAD])
    (event,) = tracker.events(final=True)
    assert (event.metrics["solid"], event.metrics["last_solid"]) == (2, 1.0)
    tracker = Tracker(DebugConfig(persistence=2))
    feed(tracker, [DEAD] * 3)
    (event,) = tracker.events(final=True)
    assert "solid" not in event.metrics and "last_solid" not in event.metrics  # every observation past it


def test_a_state_shorter_than_the_persistence_is_not_an_event_unless_decisive():
    tracker = Tracker(DebugConfig(persistence=3))
    feed(tracker, [None, DEAD, DEAD, None, None, NAN, None])
    events = tracker.events()
    assert [(e.to_state, e.step_start, e.from_state) for e in events] == [("non_finite", 5, "normal")]


def test_a_short_run_whose_own_steps_prove_it_is_an_event_from_its_first_provisional_step():
    """Provisional observations wait for evidence; a finding that ``confirms_run`` brings it, and the run counts
    from its first step though fewer than ``persistence`` of its observations were solid. The same run without
    that finding (two solid observations, then it ends) is no event."""
    dating = dataclasses.replace(DEAD, provisional=True)
    solid = dataclasses.replace(DEAD, metrics={"dead_fraction": 0.9})
    proving = dataclasses.replace(solid, confirms_run=True)
    for last, events in ((proving, [(1, 5)]), (solid, [])):
        tracker = Tracker(DebugConfig(persistence=3, persistence_steps=5))
        feed(tracker, [None, dating, dating, dating, solid, last] + [None] * 20)
        assert [(e.step_start, e.step_end) for e in tracker.events(final=True)] == events


def test_consecutive_steps_merge_and_a_later_transition_records_where_it_came_from():
    tracker = Tracker(DebugConfig(persistence=2, early_every=1))
    feed(tracker, [None] * 4 + [DEAD] * 6)
    (event,) = tracker.events()
    assert (event.step_start, event.step_end, event.from_state) == (4, 9, "normal")


def test_a_transient_of_the_first_steps_that_resolves_is_not_an_event_but_one_still_holding_at_the_end_is():
    tracker = Tracker(DebugConfig(persistence=3, persistence_steps=5))
    feed(tracker, [DEAD] * 4 + [None] * 20)  # a zero-initialised branch: 4 steps, then it recovers
    assert tracker.events() == []
    feed(tracker, [DEAD] * 3, start=24)  # a layer that dies at the very end of a short run
    assert tracker.events() == []  # mid-run, three steps are not enough yet...
    (event,) = tracker.events(final=True)  # ...but at the end of the run it held to the end
    assert (event.step_start, event.step_end, event.metrics["ongoing"]) == (24, 26, 1.0)


def test_a_layer_flapping_between_states_does_not_grow_the_store():
    tracker = Tracker(DebugConfig(persistence=2, persistence_steps=1, early_every=4, max_events=50))
    pattern = [DEAD, DEAD, DEAD, None, None]
    feed(tracker, pattern * 2000)
    assert len(tracker.events()) == 1  # gaps shorter than the merge window extend one event


def test_the_store_keeps_the_earliest_and_the_strongest_events_when_full():
    tracker = Tracker(DebugConfig(persistence=1, persistence_steps=1, early_every=1, max_events=20))
    for i in range(300):
        strength = 1.0 if i == 250 else 0.1
        finding = Finding(EventType.ACTIVATION, FailureKind.DEAD_NEURONS, f"layer{i}", "dead", {}, strength)
        obs = Observation(findings=[finding])
        obs.saw(EventType.ACTIVATION, f"layer{i}")
        tracker.update(i * 10, [("d", obs)])
        closing = Observation()
        closing.saw(EventType.ACTIVATION, f"layer{i}")
        tracker.update(i * 10 + 1, [("d", closing)])
    events = tracker.events()
    assert len(events) <= 20
    layers = {e.layer for e in events}
    assert {"layer0", "layer1", "layer2"} <= layers  # the earliest evidence survives
    assert "layer250" in layers  # and the strongest
    assert tracker.store.dropped == 300 - len(events)


def test_series_keep_bounded_evenly_spread_points():
    series = Series(16)
    for step in range(10_000):
        series.add(step, float(step))
    points = series.points()
    assert len(points) < 16
    gaps = {b[0] - a[0] for a, b in itertools.pairwise(points)}
    assert len(gaps) == 1  # even spacing
    assert points[0][0] == 0 and points[-1][0] > 9000


def test_a_plugins_own_signal_returns_to_normal_and_a_later_finding_says_it_came_from_there():
    tracker = Tracker(DebugConfig(persistence=2, early_every=1))
    odd = Finding("wobble", None, "3", "wobbling", {}, 1.0)  # type: ignore[arg-type]  # a plugin's event type
    for step in range(40):  # far enough apart not to be merged as one flapping state
        obs = Observation()
        obs.saw("wobble", "3")  # type: ignore[arg-type]
        if step < 6 or 30 <= step < 36:
            obs.findings.append(odd)
        tracker.update(step, [("plugin", obs)])
    first, second = tracker.events(final=True)
    assert (first.step_start, first.step_end, first.from_state) == (0, 5, None)
    assert (second.step_start, second.step_end, second.from_state) == (30, 35, "normal")


def test_memory_stays_flat_on_a_long_run_whose_layer_flaps():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.randn(16, 4)
    dbg = support.NeuralDbg(model, preset="full", persistence=2)
    sizes = []
    with dbg:
        for step in range(3000):
            with torch.no_grad():
                model[0].bias.fill_(-100.0 if (step // 3) % 2 else 0.5)  # dead 3 steps, alive 3 steps
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            if step in (999, 2999):
                sizes.append((len(dbg.events), sum(len(s) for s in dbg.history.series.values())))
    (events_1k, points_1k), (events_3k, points_3k) = sizes
    assert events_1k == events_3k <= 8  # one event per layer and state, however often it flaps
    capacity = dbg.config.history_points * len(dbg.history.series)
    assert points_1k <= capacity and points_3k <= capacity


EXPLODING = Finding(EventType.ACTIVATION, FailureKind.EXPLODING_GRADIENTS, "3", "exploding", {"grad_norm": 1e5}, 0.5)


def test_a_short_explosion_that_turns_into_another_failure_is_kept_but_one_that_resolves_is_not():
    tracker = Tracker(DebugConfig(persistence=3, persistence_steps=5))
    feed(tracker, [EXPLODING, EXPLODING, EXPLODING, DEAD, DEAD, DEAD, DEAD, DEAD])  # blown up, then the units died
    assert [(e.to_state, e.step_start, e.step_end) for e in tracker.events()] == [
        ("exploding", 0, 2),
        ("dead", 3, 7),
    ]
    calm = Tracker(DebugConfig(persistence=3, persistence_steps=5))
    feed(calm, [EXPLODING, EXPLODING, EXPLODING] + [None] * 5)  # three steps, then it settled by itself
    assert calm.events() == []


def test_only_a_new_kind_of_state_asks_for_dense_observation():
    tracker = Tracker(DebugConfig())
    for step, layers in enumerate([["3"], ["3", "5"], ["3", "5", "7"]]):
        obs = Observation()
        for layer in layers:
            obs.saw(EventType.ACTIVATION, layer)
            obs.findings.append(Finding(EventType.ACTIVATION, FailureKind.DEAD_NEURONS, layer, "dead", {}, 1.0))
        tracker.update(step, [("d", obs)])
    assert tracker.started == 1  # layers dying one after another while one already is: no new dense window
    obs = Observation()
    obs.saw(EventType.ACTIVATION, "3")
    obs.findings.append(NAN)
    tracker.update(3, [("d", obs)])
    assert tracker.started == 2  # a new kind of state does ask for it
    assert tracker.has_open("d") and not tracker.has_open("other")


def test_a_state_is_one_state_as_its_enum_member_its_string_or_a_plugin_s_member_of_the_same_value():
    """A state is counted by its value: ActivationHealth.DEAD, the string "dead" and a plugin's state of that value
    name one state, so a layer dying while another already is asks for no new dense window, and closing each run
    brings the count of open ones back to none (a new one then asks again)."""
    from neuraldbg.health import ActivationHealth, HealthState

    class PluginHealth(HealthState):
        DEAD = "dead"

    tracker = Tracker(DebugConfig())
    states = [ActivationHealth.DEAD, "dead", PluginHealth.DEAD]
    for step in range(3):
        obs = Observation()
        for i, state in enumerate(states[: step + 1]):
            obs.saw(EventType.ACTIVATION, str(i))
            obs.findings.append(Finding(EventType.ACTIVATION, FailureKind.DEAD_NEURONS, str(i), state, {}, 1.0))
        tracker.update(step, [("d", obs)])
    assert tracker.started == 1
    calm = Observation()
    for i in range(3):
        calm.saw(EventType.ACTIVATION, str(i))
    tracker.update(3, [("d", calm)])  # every run ends
    assert not tracker.has_open("d")
    obs = Observation()
    obs.saw(EventType.ACTIVATION, "9")
    obs.findings.append(Finding(EventType.ACTIVATION, FailureKind.DEAD_NEURONS, "9", PluginHealth.DEAD, {}, 1.0))
    tracker.update(4, [("d", obs)])
    assert tracker.started == 2  # none was open: it begins again


def dying(tracker: Tracker, step: int, readings: dict[str, bool | None]) -> None:
    """One step's dead-units readings: layer -> provisional (an onset-level reading), or None (seen alive)."""
    obs = Observation()
    for layer, provisional in readings.items():
        obs.saw(EventType.ACTIVATION, layer)
        if provisional is not None:
            obs.findings.append(
                Finding(EventType.ACTIVATION, FailureKind.DEAD_NEURONS, layer, "dead", {}, 1.0, provisional=provisional)
            )
    tracker.update(step, [("d", obs)])


def test_a_state_first_seen_past_its_full_threshold_asks_for_dense_observation_once():
    """Units dying slowly cross the onset level (a provisional reading) long before the full one: the first solid
    reading asks for a dense window, so the readings that confirm it come before the run ends."""
    tracker = Tracker(DebugConfig())
    for step, provisional in enumerate([True, True]):
        dying(tracker, step, {"3": provisional})
    assert tracker.started == 1  # the state began
    dying(tracker, 2, {"3": False})
    assert tracker.started == 2  # ... and is past its full threshold for the first time
    for step, provisional in enumerate([False, True, False], start=3):
        dying(tracker, step, {"3": provisional})
    assert tracker.started == 2  # later solid readings of the same run ask nothing more

    # another layer's first solid reading while one layer's already is: no new window
    dying(tracker, 6, {"3": False, "5": True})
    dying(tracker, 7, {"3": False, "5": False})
    assert tracker.started == 2

    # both runs end; a run that becomes solid again later asks again
    dying(tracker, 8, {"3": None, "5": None})
    dying(tracker, 9, {"3": True})
    dying(tracker, 10, {"3": False})
    assert tracker.started == 4  # the new run began (3), then crossed its full threshold (4)


def test_a_run_past_its_full_threshold_from_its_first_reading_asks_when_another_layer_is_only_at_the_onset():
    tracker = Tracker(DebugConfig())
    dying(tracker, 0, {"3": True})
    assert tracker.started == 1  # layer 3 begins, at the onset level
    dying(tracker, 1, {"3": True, "5": False})
    assert tracker.started == 2  # layer 5 begins past its full threshold: the first solid reading of the state
    dying(tracker, 2, {"3": False, "5": False})
    assert tracker.started == 2  # layer 3's first solid reading, while layer 5's already is: nothing more
