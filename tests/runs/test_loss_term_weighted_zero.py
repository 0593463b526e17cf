"""A two-headed net (classification and regression) whose regression loss is weighted 0 by mistake: the regression
head's gradient is exactly zero on every step while the trunk below it trains through the other head. The gradient
did not vanish through depth; the loss never used that output. The explanation names the zero weight and its fix,
not residual connections or an initialisation, and the last layer's zero gradient on the cheap steps is not taken
for a degenerate loss. Twins: the weight 0.5 trains both heads and is silent; the whole loss weighted 0 on most
steps is still a degenerate loss. Ground truth by plain torch: the head's gradients, the held-out accuracy and R^2.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

TEACHER = torch.randn(12, 3, generator=torch.Generator().manual_seed(5))


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.cls = nn.Linear(64, 3)
        self.reg = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return self.cls(h), self.reg(h).squeeze(-1)


def task(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(64, 12, generator=torch.Generator().manual_seed(step))
    return x, (x @ TEACHER).argmax(1), x[:, 0] * x[:, 1] + x[:, 2].sin()


def train(weight: float, every: int = 1) -> tuple[NeuralDbg, float, float, bool]:
    """(debugger, held-out accuracy, held-out R^2, whether the regression head's gradient was exactly zero on every
    step). The loss is ``cls + weight * reg``; with ``every`` > 1 the whole loss counts on one step in ``every``."""
    torch.manual_seed(0)
    model = TwoHeads()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    zero = True
    with NeuralDbg(model) as dbg:
        for step in range(200):
            x, y, r = task(step)
            logits, out = model(x)
            loss = F.cross_entropy(logits, y) + weight * F.mse_loss(out, r)
            opt.zero_grad()
            (loss * float(step % every == 0)).backward()
            zero = zero and float(model.reg.weight.grad.abs().max()) == 0.0
            opt.step()
    x, y, r = task(99_999)
    with torch.no_grad():
        logits, out = model(x)
    accuracy = float((logits.argmax(1) == y).float().mean())
    return dbg, accuracy, float(1 - (out - r).square().mean() / r.var()), zero


@pytest.mark.parametrize("weight", [0.0, 0.5])
def test_a_loss_term_weighted_zero_is_named_with_its_weight_not_depth(weight):
    dbg, accuracy, r2, zero = train(weight)
    if weight:
        assert not zero and accuracy > 0.8 and r2 > 0.5  # plain torch: both heads learn
        assert dbg.healthy, dbg.explain_failure()
        return
    assert zero and accuracy > 0.8 and r2 < 0.1  # plain torch: the trunk and the other head learn, this head not
    (found,) = dbg.hypotheses()
    assert found.kind is FailureKind.VANISHING_GRADIENTS and found.root.layer == "reg", dbg.report()
    (text,) = dbg.explain_failure()
    assert "multiplied by 0" in text and "non-zero weight" in text, text
    assert "residual" not in text and "degenerate" not in text and "2 layers" not in text, text


def test_a_whole_loss_weighted_zero_on_most_steps_is_still_degenerate():
    dbg, _, _, zero = train(0.5, every=10)
    assert not zero  # plain torch: gradients on one step in ten, exactly zero on the others
    assert FailureKind.DEGENERATE_LOSS in {h.kind for h in dbg.hypotheses()}, dbg.report()
