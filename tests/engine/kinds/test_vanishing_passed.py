"""When a stretch of small gradients is undone as one the run passed through (a plateau while attention learns to
line up, then the fit): it ended, lasted at most a quarter of the run's steps, ended before the run's last quarter of
losses, and the loss fell (not to chance). The loss curve is written by hand: the rule's conditions one by one, on a
200-step run whose last quarter of losses starts at step 150."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from neuraldbg.capture.coverage import Coverage, RunFacts
from neuraldbg.config import DebugConfig
from neuraldbg.events import EventType, FailureKind, SemanticEvent
from neuraldbg.health import GradientHealth
from neuraldbg.kinds import loss_evidence
from neuraldbg.kinds.vanishing_gradients import VanishingGradients


def undone(start: int, end: int, **extra: float) -> bool:
    metrics = {"grad_norm": 6.7e-8, "max_layer_grad_norm": 0.55, "ratio_to_max": 1.2e-7, **extra}
    event = SemanticEvent(
        EventType.GRADIENT, FailureKind.VANISHING_GRADIENTS, "enc.q", None, start, end, None,
        GradientHealth.VANISHING, metrics, 0.86,
    )  # fmt: skip
    facts = RunFacts(1, 200, 200, DebugConfig())
    return VanishingGradients().undone(event, Coverage(last_step=199), facts)


@pytest.fixture
def curve(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    found = SimpleNamespace(verdict="fell", at_chance=False, end=SimpleNamespace(first=150))
    monkeypatch.setattr(loss_evidence, "read", lambda coverage, config: found)
    return found


def test_a_short_stretch_that_ended_early_in_a_run_whose_loss_fell_passed(curve: SimpleNamespace) -> None:
    assert undone(22, 70)


def test_a_stretch_still_holding_too_long_or_too_late_did_not_pass(curve: SimpleNamespace) -> None:
    assert not undone(22, 70, ongoing=1.0)  # still small at the last check
    assert not undone(22, 90)  # over more than a quarter of the run
    assert not undone(140, 155)  # ended only within the last quarter of losses


@pytest.mark.parametrize(("verdict", "at_chance"), [("flat", False), ("climbing", False), ("unclear", False),
                                                    ("fell", True)])  # fmt: skip
def test_nor_in_a_run_whose_loss_did_not_fall(curve: SimpleNamespace, verdict: str, at_chance: bool) -> None:
    curve.verdict, curve.at_chance = verdict, at_chance
    assert not undone(22, 70)
