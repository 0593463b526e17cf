"""A layer whose gradient is exactly zero for a stretch and then trains: a loss term weighted 0 for the first steps
of a curriculum (a multi-task model's regression head switched on at step 100). The zero is the schedule's, and the
layer trains after it: no vanishing gradient. The same term weighted 0 for the whole run leaves its head with no
gradient to the end, and is still reported. Ground truth by plain torch in each test: the head's gradient, step by
step, and its regression error against the targets' variance."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

STEPS = 300


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.classes = nn.Linear(64, 4)
        self.value = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.classes(h), self.value(h)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(64, 8, generator=g)
    return x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long(), torch.sin(x[:, 2:3]) + x[:, 3:4]


def train(switch_on: int, watched: bool) -> tuple[list[float], float, object]:
    """The regression term weighted 0 until ``switch_on``, 0.5 after: the head's gradient norm at each step, its
    held-out error over the targets' variance, and the debugger (None when plain)."""
    torch.manual_seed(0)
    model = TwoHeads()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    head: list[float] = []

    def loop() -> None:
        for step in range(STEPS):
            x, y, t = batch(step)
            logits, value = model(x)
            weight = 0.0 if step < switch_on else 0.5
            loss = F.cross_entropy(logits, y) + weight * F.mse_loss(value, t)
            opt.zero_grad()
            loss.backward()
            head.append(float(model.value.weight.grad.norm()))
            opt.step()

    dbg = support.watching(model, loop, watched)
    x, _, t = batch(10_000)
    with torch.no_grad():
        relative = float(F.mse_loss(model(x)[1], t) / t.var())
    return head, relative, dbg


def test_a_head_switched_on_by_a_curriculum_is_no_vanishing_gradient():
    head, relative, _ = train(switch_on=100, watched=False)
    # plain torch: exactly zero until the term is switched on, healthy after, and the regression is learned
    assert all(g == 0.0 for g in head[:100]) and min(head[100:]) > 1e-3
    assert relative < 0.2
    _, _, dbg = train(switch_on=100, watched=True)
    assert dbg is not None and "vanishing_gradients" not in support.kinds(dbg), dbg.report()


def test_a_head_whose_term_stays_off_is_still_reported():
    head, relative, _ = train(switch_on=STEPS, watched=False)
    assert all(g == 0.0 for g in head) and relative > 0.5  # plain torch: never trained
    _, _, dbg = train(switch_on=STEPS, watched=True)
    assert dbg is not None and "vanishing_gradients" in support.kinds(dbg), dbg.report()
