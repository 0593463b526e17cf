"""What the fixes say, from histories written by hand. A dead layer whose units died after the first step: a step
large enough to push them off (an update of a tenth of the weights) names the learning rate; updates of ordinary
size say the units died gradually and name the labels, and the inputs' scale when it is far from 1. Gradients
that explode, or a loss that turns non-finite, on inputs far from unit scale: normalising them comes first."""

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


def test_gradients_exploding_on_raw_inputs_are_told_to_normalise_them_first():
    from neuraldbg.health import GradientHealth
    from neuraldbg.kinds.exploding_gradients import ExplodingGradients

    exploding = SemanticEvent(
        EventType.GRADIENT,
        FailureKind.EXPLODING_GRADIENTS,
        "2",
        None,
        64,
        199,
        None,
        GradientHealth.EXPLODING,
        {"grad_norm": 2.9e5},
        0.98,
    )

    def series(input_rms: float, updates: float = 1e-3):
        def read(metric: str, layer: str) -> list[tuple[int, float]]:
            if metric == "input_rms":
                return [(step, input_rms) for step in range(0, 200, 16)]
            if metric == "update_ratio" and layer == "2":
                return [(step, updates) for step in range(0, 200, 16)]
            return [(0, 2e-3)] if metric == "lr" else []

        return read

    what, fix = ExplodingGradients().explain(exploding, [], TOPO, series(1080.0))
    assert fix.startswith("normalise the inputs") and "1.08e+03" in what
    _, plain = ExplodingGradients().explain(exploding, [], TOPO, series(1.0))
    assert plain.startswith("lower the learning rate (now 0.002)")
    # updates as large as a learning rate far too high makes: the learning rate, whatever the inputs' scale
    _, large = ExplodingGradients().explain(exploding, [], TOPO, series(1080.0, updates=0.5))
    assert large.startswith("lower the learning rate (now 0.002)")


def test_a_loss_turned_non_finite_on_raw_inputs_is_told_to_normalise_them_first():
    from neuraldbg.health import GradientHealth
    from neuraldbg.kinds.non_finite import NonFinite

    loss = SemanticEvent(
        EventType.LOSS, FailureKind.NON_FINITE, "", None, 0, 199, None, GradientHealth.NON_FINITE, {}, 1.0
    )

    def series(input_rms: float):
        return lambda metric, layer: [(s, input_rms) for s in range(0, 200, 16)] if metric == "input_rms" else []

    what, fix = NonFinite().explain(loss, [], TOPO, series(979.0))
    assert fix.startswith("normalise the inputs to about unit scale (their root-mean-square is 979)"), fix
    assert "979" in what
    _, plain = NonFinite().explain(loss, [], TOPO, series(1.0))
    assert plain.startswith("use a numerically stable loss on logits")
