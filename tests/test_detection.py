"""Every failure kind on a model that truly has it (checked with plain torch), and healthy twins that must
stay silent."""

from __future__ import annotations

import copy

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import EventType, FailureKind

# --------------------------------------------------------------------------------------------- dead neurons


def test_a_relu_layer_killed_by_its_bias_is_dead_from_step_0_and_blamed_on_that_layer():
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=3)
    with torch.no_grad():
        model[2].bias.fill_(-20.0)
    batches = support.regression_batches()
    # ground truth with plain torch: every unit of ReLU '3' is zero on the first batch
    truth = support.capture_outputs(model, batches(0)[0], ["3"])["3"]
    assert support.dead_unit_fraction(truth) == 1.0

    dbg, _ = support.train(model, batches)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.DEAD_NEURONS
    assert top.root.layer == "3"
    assert top.root.step_start == 0
    assert top.root.metrics["dead_fraction"] == 1.0
    # the layers upstream of the dead one get exactly zero gradient: they are in its chain, not separate faults
    upstream = {e.layer for e in top.chain if e.kind is FailureKind.VANISHING_GRADIENTS}
    assert upstream == {"0", "2"}
    assert len(dbg.hypotheses()) == 1


def test_dead_units_behind_a_functional_relu_are_found_on_the_layer_that_feeds_it():
    torch.manual_seed(0)
    model = support.FunctionalMLP()
    with torch.no_grad():
        model.fc2.bias.fill_(-30.0)
    batches = support.regression_batches()
    pre = support.capture_outputs(model, batches(0)[0], ["fc2"])["fc2"]
    assert bool((pre <= 0).all())  # plain torch: F.relu zeroes every unit of fc2

    dbg, _ = support.train(model, batches)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.DEAD_NEURONS
    assert top.root.layer == "fc2"
    assert top.root.step_start == 0
    assert "fc1" in {e.layer for e in top.chain}


def test_a_shared_activation_module_is_judged_per_call():
    torch.manual_seed(0)
    model = support.SharedActMLP()
    with torch.no_grad():
        model.fc2.bias.fill_(-30.0)  # only the second use of `act` is dead

    dbg, _ = support.train(model, support.regression_batches())

    dead = [e for e in dbg.events if e.kind is FailureKind.DEAD_NEURONS]
    assert {(e.layer, e.metrics.get("call", 0.0)) for e in dead} == {("act", 1.0)}
    assert dbg.hypotheses()[0].root.layer == "act"


def test_dead_conv_channels_after_batchnorm_are_found_in_a_cnn():
    torch.manual_seed(0)
    model = support.cnn()
    with torch.no_grad():
        model[4].bias.fill_(-10.0)  # BN beta pushes every channel of the second block below zero
    batches = support.classification_batches((3, 8, 8), 10, batch=16)
    truth = support.capture_outputs(model, batches(0)[0], ["5"])["5"]
    assert support.dead_unit_fraction(truth) == 1.0

    dbg, _ = support.train(model, batches, F.cross_entropy, steps=20)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.DEAD_NEURONS
    assert top.root.layer in {"5", "4"}
    assert top.root.step_start == 0


def test_a_layer_that_dies_mid_run_is_dated_to_when_it_died():
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=3)
    batches = support.regression_batches()

    def kill(step: int, opt: torch.optim.Optimizer) -> None:
        if step == 30:
            with torch.no_grad():
                model[2].bias.fill_(-50.0)

    dbg, _ = support.train(model, batches, steps=70, on_step=kill)

    dead = [h for h in dbg.hypotheses() if h.kind is FailureKind.DEAD_NEURONS]
    assert dead, dbg.report()
    assert dead[0].root.layer == "3"
    assert 30 <= dead[0].root.step_start <= 34


# --------------------------------------------------------------------------------------------- saturation


def test_tanh_saturated_from_init_is_rooted_at_the_first_saturated_layer_at_step_0():
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=4, act=nn.Tanh)
    with torch.no_grad():
        for i in (0, 2, 4, 6):
            model[i].weight.mul_(20.0)
    batches = support.regression_batches()
    out = support.capture_outputs(model, batches(0)[0], ["1"])["1"]
    assert float((out.abs() > 0.995).float().mean()) > 0.5  # plain torch: most outputs pinned at +-1

    dbg, _ = support.train(model, batches, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3))

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.SATURATED_ACTIVATIONS
    assert top.root.layer == "1"
    assert top.root.step_start == 0


def test_a_confident_final_sigmoid_is_not_saturation():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())
    with torch.no_grad():
        model[2].weight.mul_(30.0)  # outputs pinned near 0/1 from the start: the classifier is just confident
    gen = support.classification_batches((16,), 2)

    def batches(step: int) -> support.Batch:
        x, y = gen(step)
        return x, y.float().unsqueeze(1)

    dbg, _ = support.train(model, batches, F.binary_cross_entropy)
    assert FailureKind.SATURATED_ACTIVATIONS not in {h.kind for h in dbg.hypotheses()}


# --------------------------------------------------------------------------------------------- gradients


def test_a_deep_plain_sigmoid_net_has_vanishing_gradients_rooted_downstream():
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=14, act=nn.Sigmoid)
    batches = support.regression_batches()
    support.one_backward(model, batches(0))
    norms = support.grad_norms(model)
    assert norms["0.weight"] < 1e-6 < norms["28.weight"]  # plain torch: vanishing towards the input

    dbg, _ = support.train(model, batches, optimizer=torch.optim.SGD(model.parameters(), lr=0.01))

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.VANISHING_GRADIENTS
    assert top.root.step_start == 0
    vanishing = {e.layer for e in top.chain if e.kind is FailureKind.VANISHING_GRADIENTS}
    assert "0" in vanishing and "28" not in vanishing
    assert top.root.layer == max(vanishing, key=int)  # the most downstream vanishing layer


def test_a_too_high_learning_rate_is_exploding_before_non_finite():
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=3)
    batches = support.regression_batches()
    plain = support.plain_train(copy.deepcopy(model), batches, optimizer=None, steps=1)
    assert all(torch.isfinite(torch.tensor(plain)))

    dbg, losses = support.train(model, batches, optimizer=torch.optim.SGD(model.parameters(), lr=1.0))
    assert not all(torch.isfinite(torch.tensor(losses)))  # the run really blew up

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.EXPLODING_GRADIENTS
    assert top.root.step_start <= 3
    non_finite = [e for e in top.chain if e.kind is FailureKind.NON_FINITE]
    assert non_finite and min(e.step_start for e in non_finite) > top.root.step_start
    assert len(dbg.hypotheses()) == 1


def test_weights_far_too_large_explode_from_step_0_at_that_layer():
    torch.manual_seed(0)
    model = support.mlp(width=64, depth=4)
    with torch.no_grad():
        model[2].weight.mul_(1e4)
    batches = support.regression_batches()
    support.one_backward(model, batches(0))
    assert max(support.grad_norms(model).values()) > 1e3

    dbg, _ = support.train(model, batches, steps=20, optimizer=torch.optim.SGD(model.parameters(), lr=1e-6))

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.EXPLODING_GRADIENTS
    assert top.root.step_start == 0
    assert top.root.layer == "2"


# --------------------------------------------------------------------------------------------- non-finite


def test_a_nan_batch_at_step_k_is_a_data_problem_at_step_k():
    torch.manual_seed(0)
    model = support.mlp()
    clean = support.regression_batches()

    def batches(step: int) -> support.Batch:
        x, y = clean(step)
        if step == 23:
            x = x.clone()
            x[4, 2] = float("nan")
        return x, y

    dbg, _ = support.train(model, batches)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NON_FINITE
    assert top.root.event_type is EventType.INPUT
    assert top.root.layer == ""
    assert top.root.step_start == 23
    assert "input batch at step 23" in top.explanation
    assert len(dbg.hypotheses()) == 1


class LogLayer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)  # NaN for negative inputs


def test_a_non_finite_value_born_inside_a_layer_is_blamed_on_that_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), LogLayer(), nn.Linear(32, 1))
    batches = support.regression_batches()
    outs = support.capture_outputs(model, batches(0)[0], ["2", "3"])
    assert bool(torch.isfinite(outs["2"]).all()) and not bool(torch.isfinite(outs["3"]).all())

    dbg, _ = support.train(model, batches, steps=10)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NON_FINITE
    assert top.root.layer == "3"
    assert top.root.step_start == 0


def test_a_loss_that_turns_nan_while_outputs_are_finite_is_blamed_on_the_loss():
    torch.manual_seed(0)
    model = support.mlp()
    calls = [0]

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(out, target)
        if calls[0] >= 12:
            loss = loss + torch.log(out.sum() * 0.0)  # log(0): the loss, not the model, goes non-finite
        calls[0] += 1
        return loss

    dbg, losses = support.train(model, support.regression_batches(), loss_fn, steps=20)
    assert torch.isfinite(torch.tensor(losses[11])) and not torch.isfinite(torch.tensor(losses[12]))

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NON_FINITE
    assert top.root.event_type is EventType.LOSS
    assert top.root.step_start == 12


# --------------------------------------------------------------------------------------------- optimizer


def test_a_layer_left_out_of_the_optimizer_has_frozen_parameters_at_that_layer():
    torch.manual_seed(0)
    model = support.mlp()
    optimizer = torch.optim.Adam(list(model[2:].parameters()), lr=1e-3)
    before = model[0].weight.detach().clone()

    dbg, _ = support.train(model, support.regression_batches(), optimizer=optimizer)

    assert torch.equal(before, model[0].weight)  # plain torch: never changed
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.FROZEN_PARAMETERS
    assert top.root.layer == "0"
    assert top.root.step_start == 0
    assert {e.param for e in top.chain} == {"0.weight", "0.bias"}
    assert "not in any optimizer" in top.explanation


def test_a_param_group_with_learning_rate_zero_is_frozen():
    torch.manual_seed(0)
    model = support.cnn()
    groups = [
        {"params": model[0].parameters(), "lr": 0.0},
        {"params": list(model[1:].parameters()), "lr": 1e-3},
    ]
    dbg, _ = support.train(
        model,
        support.classification_batches((3, 8, 8), 10, batch=16),
        F.cross_entropy,
        steps=12,
        optimizer=torch.optim.SGD(groups, lr=1e-3, momentum=0.9),
    )
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.FROZEN_PARAMETERS
    assert top.root.layer == "0"
    assert "learning rate 0" in top.explanation


def test_a_backbone_frozen_on_purpose_with_requires_grad_false_is_not_reported():
    torch.manual_seed(0)
    model = support.mlp()
    for p in model[:4].parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    dbg, _ = support.train(model, support.regression_batches(), optimizer=optimizer)
    assert dbg.hypotheses() == []


def test_a_learning_rate_of_1e_7_stalls_updates():
    torch.manual_seed(0)
    model = support.mlp()
    dbg, losses = support.train(
        model, support.regression_batches(), optimizer=torch.optim.SGD(model.parameters(), lr=1e-7)
    )
    ref = support.plain_train(
        model, support.regression_batches(), steps=40, optimizer=torch.optim.SGD(model.parameters(), lr=0.0)
    )  # the same batches with no update at all: the losses are the same
    assert max(abs(a - b) for a, b in zip(losses, ref)) < 1e-3 * max(ref)
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.STALLED_UPDATES
    assert top.root.step_start == 0
    assert top.root.metrics["median_update_ratio"] < 1e-5


def test_adam_with_a_small_but_workable_learning_rate_is_not_stalled():
    torch.manual_seed(0)
    model = support.mlp()
    dbg, losses = support.train(
        model, support.regression_batches(), steps=80, optimizer=torch.optim.Adam(model.parameters(), lr=1e-4)
    )
    assert sum(losses[-10:]) < 0.9 * sum(losses[:10])  # slow, but learning
    assert dbg.hypotheses() == []


# --------------------------------------------------------------------------------------------- healthy twins


HEALTHY = {
    "tiny": (support.tiny, lambda: support.regression_batches(in_features=10), F.mse_loss, 60),
    "mlp": (support.mlp, support.regression_batches, F.mse_loss, 60),
    "cnn-batchnorm": (
        support.cnn,
        lambda: support.classification_batches((3, 8, 8), 10, batch=16),
        F.cross_entropy,
        30,
    ),
    "residual16-layernorm": (support.ResidualNet, support.regression_batches, F.mse_loss, 40),
    "lstm": (support.LSTMRegressor, support.sequence_batches, F.mse_loss, 40),
    "gru": (lambda: support.LSTMRegressor(cell=nn.GRU), support.sequence_batches, F.mse_loss, 40),
    "transformer": (support.TinyTransformer, support.token_batches, F.cross_entropy, 40),
    "shared-activation": (support.SharedActMLP, support.regression_batches, F.mse_loss, 40),
    "functional-relu": (support.FunctionalMLP, support.regression_batches, F.mse_loss, 40),
}


@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_healthy_models_produce_no_failure_event(name: str):
    build, batches, loss_fn, steps = HEALTHY[name]
    torch.manual_seed(0)
    model = build()
    dbg, losses = support.train(model, batches(), loss_fn, steps=steps)
    assert sum(losses[-5:]) < sum(losses[:5])  # it really trains
    failures = [e for e in dbg.events if e.kind is not None]
    assert failures == [], dbg.report()
    assert dbg.hypotheses() == []
    assert dbg.explain_failure() == []


# --------------------------------------------------------------------------------------------- batches of one


def test_a_narrow_relu_net_trained_one_sample_at_a_time_is_not_called_dead():
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(16, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    batches = support.regression_batches(batch=1)
    silent: dict[str, list[torch.Tensor]] = {"1": [], "3": []}
    handles = [
        model[int(name)].register_forward_hook(lambda m, i, o, name=name: silent[name].append(o.detach()[0] <= 0))
        for name in silent
    ]
    support.plain_train(copy.deepcopy(model), batches, steps=30)
    for h in handles:
        h.remove()
    # plain torch: on a single sample most units are often silent (a per-batch reading calls the layer dead) ...
    per_step = [float(s.float().mean()) for s in silent["1"]]
    assert sum(f >= 0.7 for f in per_step) >= 3
    # ... but every unit of both ReLUs fires on some sample of the run
    assert all(not bool(torch.stack(s).all(dim=0).any()) for s in silent.values())

    dbg, _ = support.train(model, batches, steps=30)

    assert FailureKind.DEAD_NEURONS not in {h.kind for h in dbg.hypotheses()}, dbg.report()


def test_a_layer_killed_by_its_bias_is_found_dead_from_step_0_with_batches_of_one():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    with torch.no_grad():
        model[2].bias.fill_(-20.0)
    batches = support.regression_batches(batch=1)
    assert support.dead_unit_fraction(support.capture_outputs(model, batches(0)[0], ["3"])["3"]) == 1.0

    dbg, _ = support.train(model, batches, steps=20)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.DEAD_NEURONS
    assert (top.root.layer, top.root.step_start) == ("3", 0)
