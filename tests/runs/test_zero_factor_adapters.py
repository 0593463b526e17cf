"""Hand-written LoRA adapters on frozen layers, whose factors are bare parameters of the user's module. With A and B
both initialised to zero, each factor's gradient is taken through the other: both are exactly zero on every step and
the adapter never moves. The explanation names the zero factors and the fix LoRA uses (A random, B zero), not
residual connections or an initialisation of the network. Twins: A random with B zero (LoRA's start) trains and is
silent; an adapter whose scale is 0 (``lora_alpha = 0`` by mistake) also gets exactly zero gradients from factors
that are not both zero, and is still found, without the factors named as the cause. Ground truth by plain torch:
the adapters' gradients and the held-out accuracy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

TEACHER = torch.randn(16, 4, generator=torch.Generator().manual_seed(3))


class Adapted(nn.Module):
    """A frozen linear layer plus a rank-4 update B @ A."""

    def __init__(self, base: nn.Linear, a_zero: bool = False, scale: float = 1.0) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        a = torch.zeros(4, base.in_features) if a_zero else torch.randn(4, base.in_features) * 0.1
        self.a = nn.Parameter(a)
        self.b = nn.Parameter(torch.zeros(base.out_features, 4))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.a.t() @ self.b.t() * self.scale


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(step))
    return x, (x @ TEACHER).argmax(1)


def train(start: str) -> tuple[NeuralDbg, float, bool]:
    """(debugger, held-out accuracy, whether the first adapter's gradients were exactly zero on every step)."""
    torch.manual_seed(0)
    first = Adapted(nn.Linear(16, 64), a_zero=start == "both_zero", scale=0.0 if start == "scale_zero" else 1.0)
    model = nn.Sequential(first, nn.ReLU(), Adapted(nn.Linear(64, 4)))
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    zero = True
    with NeuralDbg(model) as dbg:
        for step in range(200):
            x, y = batch(step)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            zero = zero and all(float(p.grad.abs().max()) == 0.0 for p in (first.a, first.b))
            opt.step()
    x, y = batch(99_999)
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).float().mean())
    return dbg, accuracy, zero


def test_adapters_whose_two_factors_start_at_zero_are_named_by_their_factors():
    dbg, accuracy, zero = train("both_zero")
    _, trained, _ = train("a_random")
    assert zero and accuracy < trained - 0.1  # plain torch: the first adapter never moves, and it costs accuracy
    (found,) = dbg.hypotheses()
    assert found.kind is FailureKind.VANISHING_GRADIENTS and found.root.layer == "0", dbg.report()
    (text,) = dbg.explain_failure()
    assert "both initialised to zero" in text and "A random" in text, text
    assert "residual" not in text and "Kaiming (ReLU)" not in text, text


@pytest.mark.parametrize("start", ["a_random", "scale_zero"])
def test_adapters_that_start_as_lora_does_are_silent_and_one_scaled_by_zero_is_not_called_zero_factors(start):
    dbg, accuracy, zero = train(start)
    if start == "a_random":
        assert not zero and accuracy > 0.8  # plain torch: it learns
        assert dbg.healthy, dbg.explain_failure()
        return
    assert zero  # plain torch: a scale of 0 gives the factors no gradient, though A is not zero
    assert FailureKind.VANISHING_GRADIENTS in {h.kind for h in dbg.hypotheses()}, dbg.report()
    text = " ".join(dbg.explain_failure())
    assert "exactly zero" in text and "both initialised to zero" not in text.split("Fix:")[0], text
