"""Healthy models must produce no failure event: healthy twins of the faulty models, batches of one, a lazy layer."""

from __future__ import annotations

import copy

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind

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


# --------------------------------------------------------------------------------------------- robustness


def test_a_model_with_a_lazy_layer_can_be_watched_before_its_first_forward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.Linear(32, 1))

    dbg, losses = support.train(model, support.regression_batches(), steps=30)  # Adam is built before forward

    assert sum(losses[-5:]) < sum(losses[:5])
    assert dbg.hypotheses() == [], dbg.report()
