"""Summed (not averaged) losses: a VAE under Adam is healthy, a learning rate meant for the mean explodes under SGD
(checked with plain torch), one scaled down for the sum is healthy."""

from __future__ import annotations

import copy
from collections.abc import Callable

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind

# --------------------------------------------------------------------------------------------- summed losses


class SmallVAE(nn.Module):
    """The PyTorch example's VAE at 14x14 pixels: 196 -> 64 -> (8, 8) -> 64 -> 196."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc21, self.fc22 = nn.Linear(196, 64), nn.Linear(64, 8), nn.Linear(64, 8)
        self.fc3, self.fc4 = nn.Linear(8, 64), nn.Linear(64, 196)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = F.relu(self.fc1(x))
        mu, logvar = self.fc21(h), self.fc22(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


def vae_loss(out: tuple[torch.Tensor, torch.Tensor, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    recon, mu, logvar = out
    return F.binary_cross_entropy(recon, x, reduction="sum") - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())


def pixel_batches(batch: int = 64) -> Callable[[int], support.Batch]:
    patterns = (torch.rand(10, 196, generator=torch.Generator().manual_seed(7)) > 0.7).float()

    def make(step: int) -> support.Batch:
        g = torch.Generator().manual_seed(700 + step)
        x = patterns[torch.randint(0, 10, (batch,), generator=g)] * (0.6 + 0.4 * torch.rand(batch, 196, generator=g))
        return x, x

    return make


def train_plain_with_norms(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    loss_fn: Callable[..., torch.Tensor],
    batches: Callable[[int], support.Batch],
    steps: int,
) -> list[float]:
    """Train without the debugger; the largest layer gradient norm (over a module's own parameters) of each step."""
    norms = []
    layers = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    for step in range(steps):
        x, y = batches(step)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        norms.append(
            max(float(torch.cat([p.grad.reshape(-1) for p in m.parameters(recurse=False)]).norm()) for m in layers)
        )
        opt.step()
    return norms


def test_a_vae_with_a_summed_loss_under_adam_is_not_exploding():
    batches, steps = pixel_batches(batch=128), 40  # the example's batch size
    torch.manual_seed(0)
    start = SmallVAE()
    summed, mean = copy.deepcopy(start), copy.deepcopy(start)
    n = batches(0)[0].numel()
    torch.manual_seed(1)
    norms = train_plain_with_norms(summed, torch.optim.Adam(summed.parameters(), lr=1e-3), vae_loss, batches, steps)
    torch.manual_seed(1)  # the same reparametrisation noise
    mean_opt = torch.optim.Adam(mean.parameters(), lr=1e-3, eps=1e-8 / n)
    mean_norms = train_plain_with_norms(mean, mean_opt, lambda o, x: vae_loss(o, x) / n, batches, steps)
    # plain torch: gradient norms of a few thousand, only because the loss is a sum: the mean twin (Adam's epsilon
    # scaled with it) has norms below 1 and follows the same weights
    assert max(norms) > 1e3 and max(mean_norms) < 1.0
    with torch.no_grad():
        apart = sum(float((a - b).pow(2).sum()) for a, b in zip(summed.parameters(), mean.parameters())) ** 0.5
        travelled = sum(float((a - b).pow(2).sum()) for a, b in zip(summed.parameters(), start.parameters())) ** 0.5
    assert apart < 1e-3 * travelled

    model = copy.deepcopy(start)
    torch.manual_seed(1)
    dbg, losses = support.train(model, batches, vae_loss, steps=steps)

    assert sum(losses[-5:]) < 0.9 * sum(losses[:5])  # it trains
    assert dbg.hypotheses() == [], dbg.report()


def test_a_summed_loss_with_a_learning_rate_meant_for_its_mean_explodes_under_sgd():
    torch.manual_seed(0)
    model = support.mlp(width=64, depth=2, in_features=16)
    batches = support.regression_batches(batch=64)
    twin = copy.deepcopy(model)
    losses = support.plain_train(
        twin,
        batches,
        lambda o, y: F.mse_loss(o, y, reduction="sum"),
        steps=12,
        optimizer=torch.optim.SGD(twin.parameters(), lr=0.02),
    )
    assert not all(torch.isfinite(torch.tensor(losses))) or max(losses) > 1e6 * losses[0]  # plain torch: diverges

    dbg, _ = support.train(
        model,
        batches,
        lambda o, y: F.mse_loss(o, y, reduction="sum"),
        steps=12,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.02),
    )

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.EXPLODING_GRADIENTS
    assert top.root.step_start <= 2


def test_a_summed_loss_with_a_learning_rate_scaled_down_for_it_is_healthy_under_sgd():
    batches, steps = pixel_batches(batch=128), 40
    torch.manual_seed(0)
    start = nn.Sequential(nn.Linear(196, 64), nn.Tanh(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 196))
    n = batches(0)[0].numel()
    summed, mean = copy.deepcopy(start), copy.deepcopy(start)
    summed_loss = lambda o, y: F.mse_loss(o, y, reduction="sum")
    norms = train_plain_with_norms(
        summed, torch.optim.SGD(summed.parameters(), lr=2.0 / n, momentum=0.9), summed_loss, batches, steps
    )
    mean_norms = train_plain_with_norms(
        mean, torch.optim.SGD(mean.parameters(), lr=2.0, momentum=0.9), F.mse_loss, batches, steps
    )
    # plain torch: the same trajectory as the mean loss at lr 2, whose gradients are n times smaller
    assert max(norms) > 1e3 and max(mean_norms) < 1.0
    assert all(torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(summed.parameters(), mean.parameters()))

    model = copy.deepcopy(start)
    dbg, losses = support.train(
        model,
        batches,
        summed_loss,
        steps=steps,
        optimizer=torch.optim.SGD(model.parameters(), lr=2.0 / n, momentum=0.9),
    )

    assert sum(losses[-5:]) < 0.9 * sum(losses[:5])  # it trains
    assert dbg.hypotheses() == [], dbg.report()
