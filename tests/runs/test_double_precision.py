"""A model trained in float64 (scientific machine learning: surrogate models, physics-informed networks) is observed
like any other. Before, the first fully observed backward pass failed on it (the loss's pull on the output was
reduced with ``dtype=float32``, which torch refuses for float64) and observation stopped at step 0, so a healthy
double-precision run ended "observation incomplete". Ground truth in plain torch."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tests.support import watching


def _surrogate() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)).double()


def _fit(lr: float, watched: bool, steps: int = 150) -> tuple[list[float], object]:
    """Fit u(x, y) = sin(pi x) cos(pi y) on fresh points each step, in float64."""
    model = _surrogate()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    losses: list[float] = []

    def loop() -> None:
        for _ in range(steps):
            xy = torch.rand(64, 2, generator=g, dtype=torch.float64)
            target = (torch.sin(math.pi * xy[:, 0]) * torch.cos(math.pi * xy[:, 1])).unsqueeze(1)
            opt.zero_grad()
            loss = F.mse_loss(model(xy), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())

    return losses, watching(model, loop, watched)


def test_a_float64_surrogate_model_is_observed_to_the_end_and_healthy():
    plain, _ = _fit(lr=3e-3, watched=False)
    assert sum(plain[-10:]) / 10 < 0.3 * sum(plain[:10]) / 10  # plain torch: it learns
    losses, dbg = _fit(lr=3e-3, watched=True)
    assert losses == plain
    assert dbg is not None and dbg.steps == 150
    assert not dbg.explain_failure(), dbg.report()


def test_a_float64_model_whose_learning_rate_is_far_too_high_is_still_diagnosed():
    plain, _ = _fit(lr=3.0, watched=False, steps=60)
    assert not all(map(math.isfinite, plain)) or max(plain[1:]) > 100 * plain[0]  # plain torch: it blows up
    losses, dbg = _fit(lr=3.0, watched=True, steps=60)
    assert losses == plain or all(map(math.isnan, (plain[-1], losses[-1])))
    assert dbg is not None and dbg.steps == 60
    found = dbg.explain_failure()
    assert found and not any("incomplete" in f for f in found), found
