"""A hand-written LoRA adapter on a frozen layer: its factors A and B start at zero both, so each gives the other an
exactly zero gradient and the adapter never moves; the explanation names that. The twin that starts A at random (B
at zero, as LoRA does) trains. Ground truth by plain torch: the adapters' gradients and the loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg


class Adapted(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, random_a: bool) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        a = torch.randn(rank, base.in_features) * 0.1 if random_a else torch.zeros(rank, base.in_features)
        self.a = nn.Parameter(a)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.a.t() @ self.b.t()


def train(random_a: bool) -> tuple[NeuralDbg, list[float], bool]:
    """(debugger, losses, whether every adapter gradient was exactly zero on every step)."""
    torch.manual_seed(0)
    model = nn.Sequential(Adapted(nn.Linear(16, 32), 4, random_a), nn.ReLU(), Adapted(nn.Linear(32, 4), 4, False))
    model[2].a.data.normal_(0, 0.1)  # the head's adapter starts as LoRA does: only its B at zero
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(16, 4, generator=g)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses, zero = [], True
    with NeuralDbg(model) as dbg:
        for _ in range(200):
            x = torch.randn(64, 16, generator=g)
            loss = F.cross_entropy(model(x), (x @ teacher).argmax(1))
            opt.zero_grad()
            loss.backward()
            zero = zero and float(model[0].a.grad.abs().max()) == 0.0 and float(model[0].b.grad.abs().max()) == 0.0
            opt.step()
            losses.append(loss.item())
    return dbg, losses, zero


@pytest.mark.parametrize("random_a", [False, True])
def test_an_adapter_whose_two_factors_start_at_zero_is_named_by_them(random_a):
    dbg, losses, zero = train(random_a)
    if random_a:
        assert not zero and sum(losses[-20:]) < 0.7 * sum(losses[:20])  # plain torch: it learns
        assert dbg.healthy, dbg.explain_failure()
        return
    assert zero  # plain torch: neither factor of the first adapter ever gets a gradient
    kinds = {h.kind for h in dbg.hypotheses()}
    assert FailureKind.VANISHING_GRADIENTS in kinds, dbg.report()
    assert any("both initialised to zero" in text for text in dbg.explain_failure()), dbg.explain_failure()
