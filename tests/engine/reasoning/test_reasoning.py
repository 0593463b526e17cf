"""Reasoning: one hypothesis per fault, the right root, chains, couplings, explanations with numbers and fixes."""

from __future__ import annotations

import statistics
from collections import OrderedDict

import pytest
import support
import torch
from torch import nn

from neuraldbg import ConfigError, EventType, FailureKind, NeuralDbg, SemanticEvent
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
    with pytest.raises(
        ConfigError, match=r"unknown selector 'vanishing_gradient' \(did you mean 'vanishing_gradients'\?\); expected"
    ):
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


# --- run-level findings ------------------------------------------------------------------------------------

V, E, D = FailureKind.VANISHING_GRADIENTS, FailureKind.EXPLODING_GRADIENTS, FailureKind.DEAD_NEURONS
S, N, F, ST = (
    FailureKind.SATURATED_ACTIVATIONS,
    FailureKind.NON_FINITE,
    FailureKind.FROZEN_PARAMETERS,
    FailureKind.STALLED_UPDATES,
)
A, G, U = EventType.ACTIVATION, EventType.GRADIENT, EventType.UPDATE


def run_event(kind: FailureKind, start: int = 0, end: int = 39, detail: str = "", **metrics: float) -> SemanticEvent:
    return SemanticEvent(EventType.RUN, kind, "", None, start, end, None, kind.value, metrics, 1.0, detail)


def zero_gradient(layer: str, start: int = 0, end: int = 39) -> SemanticEvent:
    return ev(V, layer, start, end, state="vanishing", grad_norm=0.0, exact_zero=1.0)


def test_a_degenerate_loss_is_one_hypothesis_that_claims_the_zero_gradients_and_the_stillness_it_causes():
    loss = run_event(FailureKind.DEGENERATE_LOSS, steps=40.0, loss=0.0)
    stalled = ev(ST, "", 0, 39, U, "stalled", median_update_ratio=0.0)
    events = [loss, *(zero_gradient(n) for n in "024"), stalled]
    (h,) = diagnose(events, TOPO, builtin_rules())
    assert h.kind is FailureKind.DEGENERATE_LOSS and h.root is loss
    assert {id(e) for e in h.chain} == {id(e) for e in events}
    assert all(c.cause is loss for c in h.couplings)
    assert {(c.effect.where, c.relation) for c in h.couplings} == {
        ("'0'", "zeroes the gradient of"),
        ("'2'", "zeroes the gradient of"),
        ("'4'", "zeroes the gradient of"),
        ("the model's updates", "stops"),
    }
    assert "at all 40 observed steps (loss 0)" in h.explanation and "exactly zero" in h.explanation
    assert "single output unit" in h.explanation
    assert "binary_cross_entropy_with_logits" in h.suggestion and h.explanation.endswith(h.suggestion)
    assert h.summary() == "degenerate_loss from step 0 (confidence 1.00)"


def test_a_degenerate_loss_leaves_gradients_that_are_small_but_not_zero_to_their_own_cause():
    events = [run_event(FailureKind.DEGENERATE_LOSS, steps=40.0), ev(V, "0", 0, 39, state="vanishing", grad_norm=1e-8)]
    assert [h.kind for h in diagnose(events, TOPO, builtin_rules())] == [FailureKind.DEGENERATE_LOSS, V]


def frozen(layer: str, param: str, **metrics: float) -> SemanticEvent:
    return SemanticEvent(U, F, layer, param, 0, 39, None, "frozen", {"grad_norm": 0.5, "in_optimizer": 0.0, **metrics})


def test_a_frozen_layer_whose_weight_is_zero_explains_the_zero_gradients_upstream_of_it_and_nothing_else():
    head_weight, head_bias = frozen("4", "4.weight", zero_weight=1.0), frozen("4", "4.bias")
    events = [head_bias, head_weight, zero_gradient("2"), zero_gradient("0")]
    (h,) = diagnose(events, TOPO, builtin_rules())
    assert h.kind is F and {id(e) for e in h.chain} == {id(e) for e in events}
    assert {(c.cause.param, c.effect.layer, c.relation) for c in h.couplings if c.cause is head_weight} >= {
        ("4.weight", "2", "zeroes the gradient of")
    }

    def kinds(events: list[SemanticEvent]) -> list[FailureKind | None]:
        return [h.kind for h in diagnose(events, TOPO, builtin_rules())]

    # small gradients that are not zero are not what a zero weight does
    assert kinds([head_weight, ev(V, "2", 0, 39, state="vanishing", grad_norm=1e-7)]) == [F, V]
    # a frozen layer whose weight is not zero leaves the zero gradients upstream to their own cause
    assert kinds([frozen("4", "4.weight"), zero_gradient("2")]) == [F, V]
    # and a zero weight explains nothing downstream of its layer
    assert kinds([frozen("2", "2.weight", zero_weight=1.0), zero_gradient("4")]) == [F, V]


def test_a_run_level_root_is_chosen_before_the_layer_failures_it_explains():
    # the exactly-zero gradients upstream of a dead layer would be its victims, were the loss not degenerate
    events = [
        ev(D, "3", 0, 39, A, "dead", dead_fraction=1.0, units=8.0),
        zero_gradient("0"),
        zero_gradient("2"),
        run_event(FailureKind.DEGENERATE_LOSS, steps=40.0),
    ]
    hypotheses = diagnose(events, TOPO, builtin_rules())
    assert [h.kind for h in hypotheses] == [FailureKind.DEGENERATE_LOSS, D]
    assert {e.layer for e in hypotheses[0].chain[1:]} == {"0", "2"} and len(hypotheses[1].chain) == 1


def test_nothing_learnable_ranks_first_and_an_incomplete_observation_ranks_last():
    frozen = SemanticEvent(U, F, "0", "0.weight", 0, 39, None, "frozen", {"grad_norm": 0.2, "in_optimizer": 0.0})
    events = [
        ev(S, "1", 0, 39, A, "saturated", saturated_fraction=0.8),
        frozen,
        run_event(FailureKind.INCOMPLETE_OBSERVATION, 30, 39, "the forward hook of layer '3' failed", step=30.0),
        run_event(FailureKind.DEGENERATE_LOSS, 3, 39, steps=37.0),  # seen from step 3: its first steps were cheap
    ]
    ranked = [h.kind for h in diagnose(events, TOPO, builtin_rules())]
    assert ranked == [FailureKind.DEGENERATE_LOSS, F, S, FailureKind.INCOMPLETE_OBSERVATION]


RUN_LEVEL_CASES = [
    (
        run_event(FailureKind.NO_TRAINING_OBSERVED, 0, 0, forwards=0.0),
        ["No training step was observed", "never called while NeuralDBG watched it"],
        "not empty (len(loader) > 0)",
    ),
    (
        run_event(FailureKind.NO_TRAINING_OBSERVED, 0, 0, forwards=12.0, no_grad_forwards=8.0, eval_forwards=4.0),
        ["ran 12 forward passes while watched (8 under torch.no_grad(); 4 in eval mode with no backward pass)"],
        "only validation or inference ran",
    ),
    (
        run_event(FailureKind.NO_GRADIENT, steps=40.0, trainable_parameters=6.0, backward_passes=0.0),
        [
            "the optimizer stepped 40 times",
            "no backward pass ever reached the model",
            "the 6 trainable parameters",
            "loss.backward() was never called, or the loss it was called on does not depend on the model's output",
        ],
        "call loss.backward()",
    ),
    (
        run_event(FailureKind.NO_GRADIENT, steps=40.0, trainable_parameters=6.0, backward_passes=40.0),
        ["40 backward passes ran", "the loss is detached", ".detach(), .item()", "torch.no_grad()"],
        "loss.requires_grad must be True",
    ),
    (
        run_event(
            FailureKind.EVAL_MODE_TRAINING,
            0,
            34,
            "'drop' (Dropout), 'bn1' (BatchNorm1d)",
            steps=35.0,
            mode_dependent_layers=2.0,
        ),
        [
            "35 training steps from step 0 to 34",
            "its 2 layers whose behaviour depends on the mode ('drop' (Dropout), 'bn1' (BatchNorm1d))",
            "dropout was off and batch-norm statistics were frozen while the optimizer stepped",
        ],
        "call model.train() before the training loop",
    ),
    (
        run_event(
            FailureKind.INCOMPLETE_OBSERVATION,
            30,
            39,
            "the forward hook of layer '3' failed with RuntimeError('x')",
            step=30.0,
            skipped_parameters=2.0,
        ),
        ["from step 30: the forward hook of layer '3' failed with RuntimeError('x')", "2 parameters were not"],
        "treat this run's diagnosis as partial",
    ),
]


@pytest.mark.parametrize(
    ("event", "says", "fix"),
    RUN_LEVEL_CASES,
    ids=["nothing-ran", "validation-only", "no-backward", "detached-loss", "eval-mode", "hook-failed"],
)
def test_each_run_level_finding_says_what_was_seen_with_its_numbers_and_how_to_fix_it(event, says, fix):
    (h,) = diagnose([event], TOPO, builtin_rules())
    assert h.kind is event.kind and h.root is event
    for words in says:
        assert words in h.explanation
    assert fix in h.suggestion and h.explanation.endswith(f"Fix: {h.suggestion}")


def test_a_run_only_partly_observed_is_inconclusive_never_healthy_and_its_other_findings_stay():
    from neuraldbg.export.report import verdict

    stopped = run_event(FailureKind.INCOMPLETE_OBSERVATION, 30, 39, "the forward hook of layer '3' failed", step=30.0)
    meta = {"steps_observed": 40, "model": "MLP"}
    only = diagnose([stopped], TOPO, builtin_rules())
    assert verdict(only, meta).startswith("NeuralDBG: INCONCLUSIVE - incomplete_observation in 40 observed steps")
    dead = ev(D, "3", 0, 29, A, "dead", dead_fraction=1.0, units=8.0)
    both = diagnose([stopped, dead], TOPO, builtin_rules())
    assert [h.kind for h in both] == [D, FailureKind.INCOMPLETE_OBSERVATION]
    assert verdict(both, meta).startswith("NeuralDBG: UNHEALTHY - 2 failure hypotheses")
    assert "cannot be called healthy" in both[1].explanation


def test_a_healthy_verdict_says_when_the_loss_was_too_short_to_judge():
    from neuraldbg.export.report import verdict

    def healthy(steps: int) -> str:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
        opt = torch.optim.Adam(model.parameters(), 1e-3)
        x, y = torch.randn(128, 10), torch.randint(0, 3, (128,))
        with NeuralDbg(model) as dbg:
            for _ in range(steps):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        assert dbg.healthy and dbg.meta["losses_recorded"] == steps
        return dbg.report()

    short = healthy(3)
    assert short == (
        "NeuralDBG: healthy - no training failure in 3 observed steps of Sequential. Its loss was not judged: 3 losses "
        "recorded, 64 needed to tell one that does not fall from one that has not started to."
    )
    assert healthy(64) == "NeuralDBG: healthy - no training failure in 64 observed steps of Sequential."
    config = {"loss_min_steps": 64}
    unseen = verdict([], {"steps_observed": 5, "model": "M", "losses_recorded": 0, "config": config})
    assert unseen.endswith("of M. Its loss was not seen, so whether it fell was not judged.")
    # a trace written before the count was kept says nothing it does not know
    assert verdict([], {"steps_observed": 5, "model": "M", "config": config}).endswith("steps of M.")


# --- explanations without noise ------------------------------------------------------------------------------


def surge(start: int, end: int, lr: float = 50.0) -> SemanticEvent:
    metrics = {"median_update_ratio": 1.0, "lr": lr}
    return SemanticEvent(U, None, "", None, start, end, None, "exploding", metrics, 0.8)


@pytest.mark.parametrize(
    ("event", "text"),
    [
        (
            ev(D, "3", 0, 49, A, "dead", dead_fraction=1.0, units=64.0),
            "'3': 100% of 64 units dead (never positive), steps 0-49",
        ),
        (
            SemanticEvent(EventType.INPUT, N, "", None, 7, 7, None, "non_finite"),
            "the input batch: non-finite values (inf or NaN) in the batch, step 7",
        ),
        (
            SemanticEvent(G, V, "0", None, 12, 39, "exploding", "vanishing", {"grad_norm": 0.0, "exact_zero": 1.0}),
            "'0': gradient exactly zero, steps 12-39 (previously exploding)",
        ),
        (
            SemanticEvent(U, F, "fc2", "fc2.weight", 0, 32, None, "frozen", {"in_optimizer": 0.0, "ongoing": 1.0}),
            "'fc2.weight': never updated although it gets gradients (not in any optimizer), steps 0-32, "
            "still so at the last check",
        ),
        (
            surge(0, 4),
            "the model's updates: oversized (median update/weight ratio 1, learning rate 50), steps 0-4",
        ),
        (
            run_event(FailureKind.DEGENERATE_LOSS, loss=0.0),
            "the loss: exactly zero gradient with respect to the model's output at every step, loss 0, steps 0-39",
        ),
    ],
    ids=["dead", "input", "after-exploding", "frozen", "surge", "degenerate-loss"],
)
def test_an_event_reads_as_its_place_what_held_with_its_number_and_its_steps(event, text):
    assert str(event) == text


def test_no_event_of_a_real_run_reads_as_state_names_joined_by_arrows(dead):
    for e in dead.events:
        text = str(e)
        assert "->" not in text and "normal" not in text and "initial" not in text
        assert "_" not in text.split(": ", 1)[1], text  # no raw state names such as non_finite


def test_no_coupling_links_a_place_to_itself_and_a_layers_later_states_join_its_fault():
    events = [
        ev(E, "0", 3, 5, state="exploding", grad_norm=1e5),
        ev(E, "2", 3, 5, state="exploding", grad_norm=1e4),
        ev(None, "0", 3, 9, A, "anomalous", output_rms=1e5),
        ev(N, "0", 6, 9, G, "non_finite"),
        ev(N, "2", 6, 9, G, "non_finite"),
    ]
    (h,) = diagnose(events, TOPO, builtin_rules())
    assert h.root is events[0] and len(h.chain) == 5
    assert all(c.cause.where != c.effect.where for c in h.couplings)
    linked = {id(c.effect) for c in h.couplings}
    assert {id(e) for e in h.chain[1:] if id(e) not in linked} == {id(events[2]), id(events[3])}


def test_parameters_frozen_for_the_same_reason_are_grouped_without_a_causal_link():
    def frozen(param: str) -> SemanticEvent:
        metrics = {"grad_norm": 0.3, "in_optimizer": 0.0}
        return SemanticEvent(U, F, "4", param, 0, 39, None, "frozen", metrics, 0.95)

    (h,) = diagnose([frozen("4.weight"), frozen("4.bias")], TOPO, builtin_rules())
    assert len(h.chain) == 2 and h.couplings == []
    assert "'4.weight', '4.bias'" in h.explanation and "frozen like" not in h.explanation


def test_one_learning_rate_is_one_fault_and_another_learning_rate_another():
    events = [
        surge(0, 1),
        ev(D, "3", 2, 39, A, "dead", dead_fraction=1.0, units=8.0),
        surge(20, 21),  # the same learning rate again
        surge(30, 33, lr=500.0),  # after a jump to 500
    ]
    hypotheses = diagnose(events, TOPO, builtin_rules())
    assert [(h.kind, h.root.step_start) for h in hypotheses] == [(D, 2), (FailureKind.OVERSIZED_UPDATES, 30)]
    dead = hypotheses[0]
    assert [e.step_start for e in dead.chain if e.kind is None] == [0, 20]
    assert "(median ||dW||/||W|| 1 per step from step 0, learning rate 50): the learning rate is too high" in (
        dead.explanation
    )
    assert "Oversized updates again from step 20" in dead.explanation
    assert "learning rate 500" in hypotheses[1].explanation


def test_a_surge_at_the_learning_rate_in_force_when_units_died_belongs_to_their_death():
    events = [ev(D, "3", 2, 39, A, "dead", dead_fraction=1.0, units=8.0), surge(8, 9)]

    def history(rate: float):
        return lambda metric, layer: [(0, rate), (16, rate)] if metric == "lr" else []

    (h,) = diagnose(events, TOPO, builtin_rules(), history(50.0))
    assert h.kind is D and h.chain[1] is events[1]
    assert "From step 8 the updates are oversized at the learning rate in force" in h.explanation
    assert "learning rate 50): the learning rate is too high" in h.explanation
    assert h.suggestion.startswith("lower the learning rate (now 50)")
    assert len(diagnose(events, TOPO, builtin_rules(), history(0.01))) == 2  # another rate: another fault
    assert len(diagnose(events, TOPO, builtin_rules())) == 2  # no history: the rate at the death is unknown


def test_the_surge_that_set_off_an_explosion_also_explains_the_units_it_killed_before_it():
    events = [
        surge(0, 10),
        ev(D, "3", 3, 39, A, "dead", dead_fraction=1.0, units=8.0),
        ev(E, "0", 9, 11, state="exploding", grad_norm=1e11),
    ]
    (h,) = diagnose(events, TOPO, builtin_rules())
    assert h.kind is E and h.root is events[2]
    assert {(c.cause.step_start, c.relation, c.effect.where) for c in h.couplings} == {
        (0, "set off", "'0'"),
        (0, "set off", "'3'"),
    }


def test_updates_surging_after_an_explosion_present_from_the_first_step_are_its_effect_not_the_learning_rate():
    events = [
        ev(None, "2", 0, 2, A, "amplifying", gain=196.0, output_rms=6e4),
        ev(E, "0", 0, 2, state="exploding", grad_norm=6e6),
        surge(1, 2, lr=1e-3),
    ]
    (h,) = diagnose(events, TOPO, builtin_rules())
    assert h.root is events[0]
    assert any(c.relation == "inflates" and c.effect is events[2] for c in h.couplings)
    assert "learning rate is too high" not in h.explanation
    assert h.suggestion.startswith("re-initialise '2'")


def test_a_state_measured_until_step_32_of_a_40_step_run_says_so_plainly():
    from neuraldbg.kinds.base import held as steps

    topo = Topology(order=["0"], types={}, roles={}, last_step=39)
    measured = ev(D, "0", 0, 32, A, "dead", ongoing=1.0)
    assert steps(measured, topo) == "from step 0 until the run ended at step 39 (measured up to step 32)"
    assert steps(ev(D, "0", 0, 39, A, "dead", ongoing=1.0), topo) == "from step 0 to the end of the run (step 39)"


# --- the faults of the issue, trained for real, with plain-torch ground truth ------------------------------


def named_mlp(out: int = 2) -> nn.Sequential:
    layers = [("fc1", nn.Linear(16, 64)), ("act1", nn.ReLU()), ("fc2", nn.Linear(64, 64)), ("act2", nn.ReLU())]
    return nn.Sequential(OrderedDict([*layers, ("fc3", nn.Linear(64, out))]))


def plain_truth(model: nn.Module, optimizer: torch.optim.Optimizer, batches, loss_fn, steps: int = 40) -> dict:
    """Per step, with plain torch: the largest parameter gradient norm, the median update/weight ratio of the
    weight matrices, and the fraction of 'act2' units positive on no sample; and which parameters never moved."""
    dead: list[float] = []
    hook = model.act2.register_forward_hook(lambda m, i, o: dead.append(support.dead_unit_fraction(o.detach())))
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads, ratios, got_grad = [], [], set()
    for step in range(steps):
        x, y = batches(step)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        norms = support.grad_norms(model)
        got_grad |= {n for n, g in norms.items() if g > 0}
        grads.append(max(norms.values()))
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        moved = [(p.detach() - before[n]).norm() / p.detach().norm() for n, p in model.named_parameters()]
        ratios.append(statistics.median(float(r) for r, n in zip(moved, before) if n.endswith("weight")))
    hook.remove()
    unchanged = {n for n, p in model.named_parameters() if torch.equal(p.detach(), start[n])}
    return {"grad": grads, "ratio": ratios, "dead": dead, "unchanged": unchanged, "got_grad": got_grad}


def test_a_learning_rate_of_50_is_one_hypothesis_that_names_it_and_counts_as_exploding_gradients():
    batches, loss_fn = support.classification_batches((16,), 2), nn.functional.cross_entropy
    torch.manual_seed(10)
    model = named_mlp()
    truth = plain_truth(model, torch.optim.SGD(model.parameters(), lr=50.0), batches, loss_fn)
    assert max(truth["ratio"][:5]) > 0.5  # updates as large as the weights from the first steps
    assert max(truth["grad"]) > 1e3  # gradients past the exploding threshold
    assert truth["dead"][-1] == 1.0  # and every unit of 'act2' dead by the end
    torch.manual_seed(10)
    model = named_mlp()
    dbg, _ = support.train(model, batches, loss_fn, optimizer=torch.optim.SGD(model.parameters(), lr=50.0))
    (h,) = dbg.hypotheses()
    assert h.kind is E  # what assert_no_exploding_gradients looks for
    assert "learning rate 50" in h.explanation and h.suggestion.startswith("lower the learning rate (now 50)")
    assert any(e.kind is D and e.layer == "act2" for e in h.chain)
    assert all(c.cause.where != c.effect.where for c in h.couplings)


def test_a_layer_left_out_of_the_optimizer_is_one_frozen_fault_with_no_chain_of_frozen_like_edges():
    batches = support.regression_batches()
    torch.manual_seed(0)
    model = named_mlp(out=1)
    fc2 = {id(p) for p in model.fc2.parameters()}

    def optimizer() -> torch.optim.Optimizer:
        return torch.optim.Adam([p for p in model.parameters() if id(p) not in fc2], lr=1e-3)

    truth = plain_truth(model, optimizer(), batches, nn.functional.mse_loss)
    assert truth["unchanged"] == {"fc2.weight", "fc2.bias"} <= truth["got_grad"]
    torch.manual_seed(0)
    model = named_mlp(out=1)
    fc2 = {id(p) for p in model.fc2.parameters()}
    dbg, _ = support.train(model, batches, optimizer=optimizer())
    (h,) = dbg.hypotheses()
    assert h.kind is F and {e.param for e in h.chain} == {"fc2.weight", "fc2.bias"}
    assert h.couplings == [] and dbg.detect_coupled_failures() == []
    assert "until the run ended at step 39 (measured up to step" in h.explanation
    assert "last checked" not in h.explanation
    assert "-->" not in dbg.export_mermaid_causal_graph()


def test_an_explosion_from_a_layer_initialised_too_large_is_rooted_there_and_not_blamed_on_the_learning_rate():
    batches = support.regression_batches()
    torch.manual_seed(0)
    model = named_mlp(out=1)
    with torch.no_grad():
        model.fc2.weight.mul_(300.0)
    x, _ = batches(0)
    out = support.capture_outputs(model, x, ["act1", "fc2"])
    assert out["fc2"].pow(2).mean().sqrt() > 10 * out["act1"].pow(2).mean().sqrt()  # 'fc2' amplifies its input
    support.one_backward(model, batches(0))
    assert max(support.grad_norms(model).values()) > 1e3  # gradients explode at the first step
    torch.manual_seed(0)
    model = named_mlp(out=1)
    with torch.no_grad():
        model.fc2.weight.mul_(300.0)
    dbg, _ = support.train(model, batches, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3))
    (h,) = dbg.hypotheses()
    assert h.kind is E and h.root.layer == "fc2" and h.root.step_start == 0
    assert "learning rate is too high" not in h.explanation and h.suggestion.startswith("re-initialise 'fc2'")
    assert all(c.cause.where != c.effect.where for c in h.couplings)


def test_the_layer_feeding_an_activation_is_the_nearest_one_with_parameters_before_it():
    roles = {"a": "parametric", "b": "gated", "c": "other", "d": "parametric", "e": "bounded"}
    topo = Topology(order=list(roles), types={}, roles=roles)
    fed = {name: topo.feeding(name) for name in [*roles, "", "unknown"]}
    assert fed == {"a": None, "b": "a", "c": "a", "d": "a", "e": "d", "": None, "unknown": "d"}
    assert topo.last_parametric() == "d"
    assert Topology(order=["x"], types={}, roles={"x": "gated"}).last_parametric() is None
