"""Low-rank adapters on a frozen base, their up-projection starting at zero and their down-projection tiny: Adam's
first updates are large against those tiny weights, and the loss falls many times over, then flattens at the fit's
floor. Ground truth is plain torch: the loss falls more than tenfold and the held-out accuracy is high. Not steps
too large for the loss to settle (it settled): silent."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg


class Adapted(nn.Module):
    """A frozen linear layer plus a rank-4 update B @ A, B starting at zero."""

    def __init__(self, base: nn.Linear, rank: int = 4) -> None:
        super().__init__()
        self.base = base
        self.down = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.up = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.down.t() @ self.up.t() * 2.0


def batches(step: int, teacher: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(step))
    return x, (x @ teacher).argmax(1)


def test_adapters_whose_loss_fell_tenfold_then_flattened_are_silent():
    g = torch.Generator().manual_seed(7)
    old = torch.randn(16, 3, generator=g)
    new = old + 0.7 * torch.randn(16, 3, generator=g)
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 3))
    opt = torch.optim.Adam(base.parameters(), 3e-3)
    for step in range(150):  # trained on the old task first
        x, y = batches(step, old)
        opt.zero_grad()
        F.cross_entropy(base(x), y).backward()
        opt.step()
    base.requires_grad_(False)
    model = nn.Sequential(Adapted(base[0]), base[1], Adapted(base[2]), base[3], Adapted(base[4]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], 5e-3)
    losses = []
    with NeuralDbg(model) as dbg:
        for step in range(200):
            x, y = batches(1_000 + step, new)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    x, y = batches(99_999, new)
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).float().mean())
    # plain torch (the same numbers: the debugger changes nothing): it fell more than tenfold and fits the new task
    first, last = sum(losses[:10]) / 10, sum(losses[-20:]) / 20
    assert first > 10 * last and accuracy > 0.9
    assert dbg.healthy, dbg.explain_failure()
