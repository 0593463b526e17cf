"""Dead units of a narrow hidden layer that touched the threshold chance sets for it and fell back, while the loss
fell, are undone (``kinds/dead_neurons.py`` ``_touched``). The event's counts and the loss curve are written by hand:
the rule's conditions one by one, for a layer of 16 units (threshold 12 of them) and of 64 (70 %, chance plays no
part)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from neuraldbg.capture.coverage import Coverage, RunFacts
from neuraldbg.config import DebugConfig
from neuraldbg.events import EventType, FailureKind, SemanticEvent
from neuraldbg.health import ActivationHealth
from neuraldbg.kinds import loss_evidence
from neuraldbg.kinds.dead_neurons import DeadNeurons, chance_dead_fraction


def undone(units: int = 16, **metrics: float) -> bool:
    values = {"dead_fraction": 13 / 16, "dead_units": 13.0, "units": float(units), "observations": 23.0}
    values.update(solid=11.0, last_solid=0.0, ongoing=1.0)  # held to the end, short of the threshold at the end
    values.update(metrics)
    event = SemanticEvent(
        EventType.ACTIVATION, FailureKind.DEAD_NEURONS, "mlp.3", None, 0, 384, None, ActivationHealth.DEAD,
        {k: v for k, v in values.items() if v is not None}, 0.74,
    )  # fmt: skip
    facts = RunFacts(1, 400, 400, DebugConfig())
    return DeadNeurons().undone(event, Coverage(last_step=399), facts)


@pytest.fixture
def curve(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    # a curve that fell sixfold: not the tenth the spared-fall rule asks, so only the rule under test undoes
    found = SimpleNamespace(
        verdict="fell", at_chance=False, start=SimpleNamespace(mean=0.64, last=55),
        end=SimpleNamespace(mean=0.10, first=296, spread=0.01),
    )  # fmt: skip
    monkeypatch.setattr(loss_evidence, "read", lambda coverage, config: found)
    monkeypatch.setattr(loss_evidence, "fell_below", lambda curve, before, share: False)
    return found


def test_a_narrow_layer_that_touched_its_threshold_and_fell_back_while_the_loss_fell_is_undone(curve):
    assert chance_dead_fraction(16) == 0.75 > DebugConfig().dead_unit_fraction  # chance sets this layer's threshold
    assert undone()
    assert undone(units=8, dead_units=7.0, dead_fraction=7 / 8, observations=35.0, solid=9.0)


def test_a_narrow_layer_past_its_threshold_at_the_end_or_most_of_the_time_is_not(curve):
    assert not undone(last_solid=1.0)  # still past it at the latest observation
    assert not undone(solid=12.0)  # past it on more than half of the observations
    assert not undone(solid=None, last_solid=None)  # past it on every observation (the tracker writes no count)


def test_a_wide_layer_is_not_judged_by_it(curve):
    assert chance_dead_fraction(64) == 0.0  # 70 % decides alone
    assert not undone(units=64, dead_units=52.0, dead_fraction=52 / 64)


@pytest.mark.parametrize(("verdict", "at_chance"), [("flat", False), ("climbing", False), ("fell", True)])
def test_nor_in_a_run_whose_loss_did_not_fall(curve, verdict, at_chance):
    curve.verdict, curve.at_chance = verdict, at_chance
    assert not undone()
