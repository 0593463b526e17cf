"""A gradient small by construction from the first reading, interrupted by one healthy reading, small again and then
grown out of (a selective-scan model's step-size projection: 3e-6 of the head's at step 0, 1e-4 at step 32, 2e-5
over steps 48-160, healthy after): the vanishing event that began after the interruption is undone as a start
training grew out of; the same stretch after a healthy first reading is still reported. History written by hand."""

from __future__ import annotations

from neuraldbg import EventType, FailureKind, SemanticEvent
from neuraldbg.capture.coverage import Coverage, RunFacts
from neuraldbg.config import DebugConfig
from neuraldbg.health import GradientHealth
from neuraldbg.kinds.vanishing_gradients import VanishingGradients
from neuraldbg.stats.history import History, Series

STEPS = 352


def judged(first: float) -> bool:
    """``first``: the layer's gradient at step 0 (the head's is 1)."""
    config = DebugConfig()
    history = History(256)
    largest = Series(256)
    for step in range(0, STEPS, 16):
        own = first if step == 0 else 1e-4 if step == 32 else 2e-5 if 48 <= step <= 160 else 0.05
        history.add("grad_norm", "dt_proj", step, own)
        largest.add(step, 1.0)
    event = SemanticEvent(
        EventType.GRADIENT,
        FailureKind.VANISHING_GRADIENTS,
        "dt_proj",
        None,
        48,
        160,
        None,
        GradientHealth.VANISHING,
        {},
        0.9,
    )
    coverage = Coverage()
    coverage.last_step = coverage.last_full_step = STEPS - 1
    facts = RunFacts(1, STEPS, STEPS, config, history, largest)
    return VanishingGradients().undone(event, coverage, facts)


def test_a_small_start_interrupted_once_and_grown_out_of_is_undone():
    assert judged(first=3e-6)


def test_the_same_stretch_after_a_healthy_first_reading_is_still_reported():
    assert not judged(first=0.05)
