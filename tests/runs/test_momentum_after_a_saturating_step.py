"""A learning rate so high that its first Adam step saturates a sigmoid output for every input: from the next step
every gradient is exactly zero, and Adam's momentum goes on moving the weights by a large share of their size for
several steps while the loss stays far above where it began. The vanishing gradients are the learning rate's doing,
and the explanation says so. The program: a coordinate MLP with sinusoidal encoding fitting a 2-D image (a NeRF in
two dimensions), the sigmoid inside the model's forward. Ground truth by plain torch: the loss, the gradients, the
update/weight ratios (parameter copies around ``optimizer.step()``), against the same program at lr 1e-3."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

SIZE = 48
FREQS = (2.0 ** torch.arange(6)) * math.pi


def image() -> tuple[torch.Tensor, torch.Tensor]:
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, SIZE), torch.linspace(-1, 1, SIZE), indexing="ij")
    rgb = torch.stack(
        [
            0.5 + 0.4 * torch.sin(3 * xx + 2 * yy),
            ((xx - 0.2) ** 2 + yy**2 < 0.3).float() * 0.7 + 0.15,
            0.5 + 0.4 * torch.sign(torch.sin(6 * xx)) * torch.cos(4 * yy),
        ],
        -1,
    )
    return torch.stack([xx, yy], -1).reshape(-1, 2), rgb.reshape(-1, 3)


class Field(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(26, 128),
            nn.ReLU(),
            nn.Linear(128, 128),
            nn.ReLU(),
            nn.Linear(128, 128),
            nn.ReLU(),
            nn.Linear(128, 3),
        )

    def forward(self, xy: torch.Tensor) -> torch.Tensor:
        angles = xy[..., None] * FREQS
        return torch.sigmoid(self.mlp(torch.cat([xy, torch.sin(angles).flatten(1), torch.cos(angles).flatten(1)], 1)))


def fit(lr: float, steps: int = 120) -> tuple[NeuralDbg, list[float], list[bool], list[float]]:
    """(debugger, losses, whether every gradient was exactly zero, median update/weight ratio) per step."""
    torch.manual_seed(0)
    coords, rgb = image()
    model = Field()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    losses, zero, ratios = [], [], []
    with NeuralDbg(model) as dbg:
        for _ in range(steps):
            idx = torch.randint(0, len(coords), (1024,), generator=g)
            opt.zero_grad()
            loss = F.mse_loss(model(coords[idx]), rgb[idx])
            loss.backward()
            weights = [p for p in model.parameters() if p.dim() == 2]
            before = [w.detach().clone() for w in weights]
            opt.step()
            losses.append(loss.item())
            zero.append(all(float(p.grad.abs().max()) == 0.0 for p in model.parameters()))
            moved = sorted(float((w.detach() - b).norm() / b.norm()) for w, b in zip(weights, before))
            ratios.append((moved[1] + moved[2]) / 2)
    return dbg, losses, zero, ratios


def test_vanishing_gradients_after_a_step_that_saturated_the_output_are_the_learning_rates_doing():
    dbg, losses, zero, ratios = fit(lr=0.1)
    # plain torch: the first step rewrites the weights, every gradient is exactly zero from one of the next steps
    # on, Adam's momentum keeps moving the weights by more than a tenth of their size for some steps after that,
    # and the loss ends far above where it began
    first = zero.index(True)
    assert ratios[0] > 0.5 and 0 < first <= 3 and all(zero[first:])
    assert all(r > 0.1 for r in ratios[first : first + 3])
    assert sum(losses[-20:]) / 20 > 2 * losses[0]
    top = dbg.hypotheses()[0]
    assert top.kind in {FailureKind.VANISHING_GRADIENTS, FailureKind.DEAD_NEURONS}, dbg.report()
    text = dbg.explain_failure()[0]
    assert "oversized updates" in text and "lower the learning rate (now 0.1)" in text, text


def test_the_same_field_at_its_own_learning_rate_is_silent():
    dbg, losses, zero, _ = fit(lr=1e-3)
    assert not any(zero) and sum(losses[-20:]) / 20 < 0.5 * losses[0]  # plain torch: it fits
    assert dbg.healthy, dbg.explain_failure()
