"""What a dead layer's fix says when its units died after the first step, from the history written by hand: a step
large enough to push them off (an update of a tenth of the weights) names the learning rate; updates of ordinary
size say the units died gradually and name the labels, and the inputs' scale when it is far from 1."""

from __future__ import annotations

from neuraldbg import EventType, FailureKind, SemanticEvent
from neuraldbg.kinds.dead_neurons import KICK, DeadNeurons
from neuraldbg.reasoning import Topology

TOPO = Topology(order=["0", "1", "2"], types={"1": "ReLU"}, roles={"0": "parametric", "2": "parametric"}, last_step=199)
DEAD = SemanticEvent(
    EventType.ACTIVATION, FailureKind.DEAD_NEURONS, "1", None, 40, 199, None, "dead", {"dead_fraction": 0.9}, 0.9
)


def fix(updates: float, input_rms: float = 1.0) -> str:
    def series(metric: str, layer: str) -> list[tuple[int, float]]:
        if metric == "update_ratio" and layer == "0":
            return [(step, updates) for step in range(0, 200, 16)]
        if metric == "input_rms" and layer == "":
            return [(step, input_rms) for step in range(0, 200, 16)]
        if metric == "lr":
            return [(0, 1e-3)]
        return []

    return DeadNeurons().explain(DEAD, [], TOPO, series)[1]


def test_units_killed_by_a_large_step_are_told_to_lower_the_learning_rate():
    assert fix(updates=5 * KICK).startswith("lower the learning rate (now 0.001)")


def test_units_that_died_under_ordinary_updates_are_not_blamed_on_a_large_step():
    words = fix(updates=KICK / 10)
    assert "lower the learning rate" not in words and "large update" not in words
    assert words.startswith("check that the labels follow their inputs") and "at most 0.002" in words


def test_raw_inputs_come_first_when_the_units_died_gradually():
    assert fix(updates=KICK / 10, input_rms=177.0).startswith("normalise the inputs (their root-mean-square is 177")
    assert fix(updates=5 * KICK, input_rms=177.0).startswith("lower the learning rate")
