"""When a vanishing-gradient event that began at the layer's first reading is undone as a start the layer grew out
of (:func:`neuraldbg.kinds.vanishing_gradients._grew_out`): a clearly healthy reading after the event (by both the
absolute and the relative test), none within it, compared with the largest layer's gradient at the very same
steps."""

from __future__ import annotations

from neuraldbg.capture.coverage import Coverage, RunFacts
from neuraldbg.config import DebugConfig
from neuraldbg.events import EventType, FailureKind, SemanticEvent
from neuraldbg.health import GradientHealth
from neuraldbg.kinds.vanishing_gradients import VanishingGradients
from neuraldbg.stats.history import History, Series


def event(start: int, end: int, **extra: float) -> SemanticEvent:
    metrics = {"grad_norm": 1e-7, "small_from_first_reading": 1.0, **extra}
    return SemanticEvent(
        EventType.GRADIENT,
        FailureKind.VANISHING_GRADIENTS,
        "embed",
        None,
        start,
        end,
        None,
        GradientHealth.VANISHING,
        metrics,
        0.9,
    )


def undone(e: SemanticEvent, readings: dict[int, float], largest: dict[int, float] | None = None) -> bool:
    history, tops = History(256), Series(256)
    for step, norm in readings.items():
        history.add("grad_norm", "embed", step, norm)
    for step in readings if largest is None else largest:
        tops.add(step, 0.5 if largest is None else largest[step])
    facts = RunFacts(1, 1, 1, DebugConfig(), history, tops)
    return VanishingGradients().undone(e, Coverage(), facts)


def test_a_start_the_layer_grew_out_of_is_undone():
    assert undone(event(0, 16), {0: 3e-8, 8: 1e-7, 16: 1e-6, 40: 1e-3})  # DeBERTa's position table


def test_a_small_gradient_that_never_grows_is_kept():
    assert not undone(event(0, 40), {0: 3e-8, 8: 1e-7, 40: 1e-7, 48: 2e-8})
    assert not undone(event(0, 40, ongoing=1.0), {0: 3e-8, 40: 1e-7})


def test_an_event_holding_a_healthy_reading_was_merged_from_two_stretches_and_is_kept():
    assert not undone(event(0, 60), {0: 3e-8, 24: 1e-3, 40: 1e-7, 60: 1e-7, 80: 1e-3})


def test_the_ratio_is_judged_against_the_largest_layer_at_the_same_step_only():
    # 2e-4: above vanishing_norm (1e-4); healthy against a largest layer of 1e-2 (ratio 2e-2 > 1e-3) ...
    assert undone(event(0, 8), {0: 1e-8, 8: 1e-8, 16: 2e-4}, {0: 1.0, 8: 1.0, 16: 1e-2})
    # ... small against one of 1.0 (ratio 2e-4); and a step the largest layer's history does not hold is not compared
    assert not undone(event(0, 8), {0: 1e-8, 8: 1e-8, 16: 2e-4}, {0: 1.0, 8: 1.0, 16: 1.0})
    assert not undone(event(0, 8), {0: 1e-8, 8: 1e-8, 17: 2e-4}, {0: 1.0, 8: 1.0, 16: 1e-2})


def test_a_reading_healthy_by_one_test_only_is_not_grown_out_of():
    # behind a saturated softmax: 0.6 at a step where the largest layer surges to 1.2e3 (above vanishing_norm, but
    # 5e-4 of the largest), then ~1e-7 again: the layer did not grow out of it
    assert not undone(event(0, 20), {0: 0.0, 20: 1e-7, 21: 0.6, 30: 1e-7}, {0: 0.1, 20: 0.1, 21: 1.2e3, 30: 0.1})
    # 2e-5 against a largest of 1e-2 (2e-3 of it, but below vanishing_norm): no sign of health either
    assert not undone(event(0, 8), {0: 1e-8, 8: 1e-8, 16: 2e-5}, {0: 1.0, 8: 1.0, 16: 1e-2})
    # healthy by both tests at the same surge: grown out of
    assert undone(event(0, 20), {0: 0.0, 20: 1e-7, 21: 17.0}, {0: 0.1, 20: 0.1, 21: 1.2e3})


def test_an_event_without_the_flag_is_not_undone_by_growth():
    e = event(10, 20)
    plain = SemanticEvent(e.event_type, e.kind, e.layer, e.param, 10, 20, None, e.to_state, {"grad_norm": 1e-7}, 0.9)
    assert not undone(plain, {10: 1e-7, 20: 1e-7, 30: 1e-3})
