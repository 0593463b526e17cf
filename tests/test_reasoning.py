"""Reasoning: one hypothesis per fault, the right root, chains, couplings, explanations with numbers and fixes."""

from __future__ import annotations

import pytest
import support
import torch
from torch import nn

from neuraldbg import ConfigError, EventType, FailureKind, SemanticEvent
from neuraldbg.reasoning import Topology, builtin_rules, diagnose


def dead_run() -> support.NeuralDbg:
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=4)
    with torch.no_grad():
        model[4].bias.fill_(-25.0)
    dbg, _ = support.train(model, support.regression_batches())
    return dbg


@pytest.fixture(scope="module")
def dead() -> support.NeuralDbg:
    return dead_run()


def test_twelve_victims_of_one_dead_layer_are_one_hypothesis_whose_chain_lists_them():
    torch.manual_seed(0)
    model = support.mlp(width=64, depth=14)
    with torch.no_grad():
        model[24].bias.fill_(-40.0)  # the ReLU '25' is dead: the 12 Linear layers before it get zero gradient
    dbg, _ = support.train(model, support.regression_batches(), steps=20)
    hypotheses = dbg.hypotheses()
    assert len(hypotheses) == 1
    (h,) = hypotheses
    assert h.kind is FailureKind.DEAD_NEURONS and h.root.layer == "25"
    victims = sorted({e.layer for e in h.chain if e.kind is FailureKind.VANISHING_GRADIENTS}, key=int)
    assert victims == [str(i) for i in range(0, 25, 2)]
    assert len(dbg.get_root_causes()) == 1


def test_the_explanation_names_the_layer_the_steps_the_numbers_the_effect_and_a_fix(dead):
    (text,) = dead.explain_failure()
    assert text.startswith("Dead neurons in '5' (ReLU), fed by '4' (Linear): 100% of 32 units")
    assert "from step 0" in text
    assert "vanishing or zero gradients in '0', '2', '4'" in text
    assert "Fix:" in text and "bias" in text
    (h,) = dead.hypotheses()
    assert h.suggestion in text


def test_confidence_comes_from_the_evidence():
    strong = dead_run().hypotheses()[0].confidence
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=2)
    with torch.no_grad():
        model[2].bias[:24].fill_(-25.0)  # 24 of 32 units dead: just past the 70% threshold
    dbg, _ = support.train(model, support.regression_batches(), steps=20)
    weak = dbg.hypotheses()[0]
    assert weak.kind is FailureKind.DEAD_NEURONS
    assert 0 < weak.confidence < strong <= 1


def test_couplings_are_directed_deduplicated_and_proportional_to_the_faults(dead):
    couplings = dead.detect_coupled_failures()
    (h,) = dead.hypotheses()
    assert len(couplings) == len(h.chain) - 1
    assert all(c.cause.kind is FailureKind.DEAD_NEURONS for c in couplings)
    upstream = [c for c in couplings if c.relation == "zeroes the gradient of"]
    assert {c.effect.layer for c in upstream} == {"0", "2", "4"}
    assert all(c.cause is h.root for c in upstream)
    assert len({(id(c.cause), id(c.effect)) for c in couplings}) == len(couplings)


@pytest.mark.parametrize(
    "selector",
    [FailureKind.VANISHING_GRADIENTS, "vanishing_gradients", "VANISHING_GRADIENTS", "vanishing", EventType.GRADIENT],
)
def test_trace_causal_chain_accepts_kinds_event_types_and_their_names(dead, selector):
    chain = dead.trace_causal_chain(selector)
    assert chain[0].kind is FailureKind.DEAD_NEURONS  # the chain leading to the vanishing starts at its cause
    assert {e.layer for e in chain[1:]} == {"0", "2", "4"}


def test_trace_causal_chain_of_the_root_kind_is_the_whole_chain_and_unknown_names_are_errors(dead):
    assert dead.trace_causal_chain("dead_neurons") == dead.hypotheses()[0].chain
    assert dead.trace_causal_chain(FailureKind.NON_FINITE) == []
    with pytest.raises(ConfigError, match=r"unknown selector 'vanishing_gradient'.*vanishing_gradients"):
        dead.trace_causal_chain("vanishing_gradient")


def ev(kind, layer, start, end=None, etype=EventType.GRADIENT, state="x", **metrics) -> SemanticEvent:
    return SemanticEvent(etype, kind, layer, None, start, start if end is None else end, None, state, metrics, 0.8)


TOPO = Topology(
    order=["0", "1", "2", "3", "4"], types={}, roles={"0": "parametric", "2": "parametric", "4": "parametric"}
)


def test_an_explosion_explains_the_non_finite_values_that_follow_it():
    events = [
        ev(FailureKind.EXPLODING_GRADIENTS, "4", 3, 5, state="exploding", grad_norm=1e5),
        ev(FailureKind.EXPLODING_GRADIENTS, "0", 4, 5, state="exploding", grad_norm=1e6),
        ev(FailureKind.NON_FINITE, "0", 6, 9, EventType.ACTIVATION, "non_finite"),
        ev(FailureKind.NON_FINITE, "", 6, 9, EventType.LOSS, "non_finite"),
    ]
    (h,) = diagnose(events, TOPO, builtin_rules())
    assert h.kind is FailureKind.EXPLODING_GRADIENTS
    assert (h.root.layer, h.root.step_start) == ("4", 3)  # the first to explode
    assert {e.kind for e in h.chain} == {FailureKind.EXPLODING_GRADIENTS, FailureKind.NON_FINITE}


def test_non_finite_first_seen_in_the_input_is_a_data_problem_and_inside_a_layer_blames_the_layer():
    from_input = [
        ev(FailureKind.NON_FINITE, "", 7, etype=EventType.INPUT, state="non_finite"),
        *[ev(FailureKind.NON_FINITE, n, 7, 20, EventType.ACTIVATION, "non_finite") for n in "01234"],
    ]
    (h,) = diagnose(from_input, TOPO, builtin_rules())
    assert h.root.event_type is EventType.INPUT and h.root.step_start == 7
    assert "input batch at step 7" in h.explanation

    from_layer = [ev(FailureKind.NON_FINITE, n, 7, 20, EventType.ACTIVATION, "non_finite") for n in "234"]
    (h,) = diagnose(from_layer, TOPO, builtin_rules())
    assert h.root.layer == "2"
    assert "'2' produced non-finite values" in h.explanation


def test_independent_faults_are_separate_hypotheses_ranked_by_evidence():
    events = [
        ev(FailureKind.DEAD_NEURONS, "3", 0, 40, EventType.ACTIVATION, "dead", dead_fraction=1.0, units=8.0),
        ev(FailureKind.VANISHING_GRADIENTS, "2", 0, 40, state="vanishing", grad_norm=0.0, exact_zero=1.0),
        SemanticEvent(
            EventType.UPDATE,
            FailureKind.FROZEN_PARAMETERS,
            "4",
            "4.weight",
            0,
            40,
            None,
            "frozen",
            {"grad_norm": 0.3, "in_optimizer": 0.0},
            0.95,
        ),
    ]
    hypotheses = diagnose(events, TOPO, builtin_rules())
    assert [h.kind for h in hypotheses] == [FailureKind.FROZEN_PARAMETERS, FailureKind.DEAD_NEURONS]
    assert hypotheses[1].chain[1].layer == "2"


def test_healthy_runs_have_no_hypotheses():
    assert diagnose([], TOPO, builtin_rules()) == []
    anomalies_only = [ev(None, "2", 0, 3, EventType.ACTIVATION, "anomalous", output_rms=2e3)]
    assert diagnose(anomalies_only, TOPO, builtin_rules()) == []


def test_saturated_tanh_explains_the_shrinking_gradients_upstream_of_it():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 32), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)
    )
    with torch.no_grad():
        model[1].weight.mul_(200.0)
        model[3].weight.mul_(200.0)
    dbg, _ = support.train(model, support.regression_batches(), optimizer=torch.optim.SGD(model.parameters(), lr=1e-3))
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.SATURATED_ACTIVATIONS and top.root.layer == "2"
    assert "Fix:" in top.explanation and "Xavier" in top.explanation
