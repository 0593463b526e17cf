"""Two normalisations in a row cancel the first one's gradient without a fault; gradients that truly vanish behind
normalisation are still reported (checked with plain torch)."""

from __future__ import annotations

import copy

import pytest
import support
import torch
import torch.nn.functional as F
from support import layer_gradients
from torch import nn

from neuraldbg import FailureKind

# --------------------------------------------------------------------------------------------- double normalisation


DOUBLE_NORMS = {
    "batchnorm-batchnorm": lambda: nn.Sequential(
        nn.Linear(16, 32), nn.BatchNorm1d(32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1)
    ),
    "layernorm-batchnorm": lambda: nn.Sequential(
        nn.Linear(16, 32), nn.LayerNorm(32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1)
    ),
    "conv-batchnorm-batchnorm": lambda: nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    ),
}


def output_moves(model: nn.Module, x: torch.Tensor, layer: str) -> float:
    """Plain torch: how far the (training-mode) output moves, relative, when ``layer``'s weight is scaled by random
    positive factors and its bias shifted."""
    model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        before = model(x)
        module = dict(model.named_modules())[layer]
        module.weight.mul_(torch.exp(0.3 * torch.randn(module.weight.shape, generator=g)))
        module.bias.add_(0.3 * torch.randn(module.bias.shape, generator=g))
        return float((model(x) - before).norm() / before.norm())


@pytest.mark.parametrize("name", sorted(DOUBLE_NORMS))
def test_two_normalisations_in_a_row_cancel_the_first_ones_gradient_without_a_fault(name: str):
    torch.manual_seed(0)
    model = DOUBLE_NORMS[name]()
    conv = name.startswith("conv")
    batches = support.classification_batches((3, 8, 8), 10, batch=16) if conv else support.regression_batches()
    loss_fn = F.cross_entropy if conv else F.mse_loss
    probe = copy.deepcopy(model)
    support.one_backward(probe, batches(0), loss_fn)
    grads = layer_gradients(probe)
    # plain torch: the first norm's gradient is ~0 (the second one divides its scale out and adds its shift back),
    # and changing its parameters changes nothing
    assert grads["1"] < 1e-4 and grads["1"] < 1e-3 * max(grads.values())
    assert output_moves(model, batches(0)[0], "1") < 1e-4
    assert output_moves(model, batches(0)[0], "2") > 1e-2  # the second norm's are not redundant

    dbg, losses = support.train(
        model, batches, loss_fn, steps=40, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2)
    )

    assert sum(losses[-5:]) < sum(losses[:5])
    assert dbg.hypotheses() == [], dbg.report()


def test_a_normalised_net_whose_gradients_truly_vanish_is_still_reported():
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(16, 32), nn.BatchNorm1d(32), nn.BatchNorm1d(32), nn.ReLU()]
    for _ in range(6):
        layers += [nn.Linear(32, 32), nn.Sigmoid()]
    model = nn.Sequential(*layers, nn.Linear(32, 1))
    batches = support.regression_batches()
    probe = copy.deepcopy(model)
    support.one_backward(probe, batches(0))
    grads = layer_gradients(probe)
    # plain torch: six sigmoids downstream shrink the gradient to ~1e-5 of the head's at the Linear and the second
    # BatchNorm (the first BatchNorm's is ~0 anyway, cancelled by the second)
    for name in ("0", "2", "4"):
        assert grads[name] < 1e-4 and grads[name] < 1e-3 * max(grads.values()), name

    dbg, _ = support.train(model, batches, optimizer=torch.optim.SGD(model.parameters(), lr=0.01))

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.VANISHING_GRADIENTS
    assert top.root.step_start == 0
    assert {"0", "2", "4"} <= {e.layer for e in top.chain if e.kind is FailureKind.VANISHING_GRADIENTS}


def test_batchnorm_and_instancenorm_cancel_a_per_channel_affine_and_layernorm_does_not():
    from neuraldbg.model.layers import describe

    model = nn.Sequential(
        nn.Linear(8, 8), nn.BatchNorm1d(8), nn.InstanceNorm1d(8, affine=True), nn.LayerNorm(8), nn.GroupNorm(2, 8)
    )
    renormalizing = {name for name, info in describe(model, 0.01).items() if info.renormalizes_channels}
    assert renormalizing == {"1", "2"}
    # plain torch: a LayerNorm right after another LayerNorm does see the first one's per-feature affine
    torch.manual_seed(0)
    stacked = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.LayerNorm(32), nn.Linear(32, 1))
    assert output_moves(stacked, support.regression_batches()(0)[0], "1") > 1e-2
