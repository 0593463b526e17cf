"""Updates stalled by gradient clipping to a tiny norm: ``clip_grad_norm_(max_norm=1e-4)`` under SGD hands the
optimizer gradients thousands of times smaller than the backward pass left them, so the weights barely move and a
CNN stays at chance (sweep D, row 24). The stall is read twice, step by step and over the whole run; it is one
fault, and its fix is the clipping's threshold, not the learning rate (the sweep's second hypothesis said "raise the
learning rate about 660x"). Ground truth is plain torch: the gradient norms before and after clipping, the update
ratios, and the held-out accuracy against the same run clipped at 1.0. The rule still bites: the same CNN at a
learning rate far too low, unclipped, is one stall whose fix is the learning rate."""

from __future__ import annotations

import math

import support
import torch
import torch.nn.functional as F
from torch import nn

STEPS = 100
TEMPLATES = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(123))


def images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four classes of 8x8 images: a template per class under unit noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    return TEMPLATES[y] * 0.7 + torch.randn(n, 1, 8, 8, generator=g), y


def cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64, 4),
    )


class Run:
    """One training run of the CNN, and what plain torch measured of it."""

    def __init__(self, lr: float, clip: float | None, watched: bool) -> None:
        self.model = cnn()
        self.before: list[float] = []  # the gradient norm the backward pass left
        self.after: list[float] = []  # ... and the one the optimizer got
        self.ratios: list[float] = []  # ||dW|| / ||W|| of each step
        x, y = images(2048, seed=1)
        opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        order = torch.randperm(2048, generator=torch.Generator().manual_seed(2))

        def loop() -> None:
            for step in range(STEPS):
                rows = order[step * 32 % 2048 :][:32]
                opt.zero_grad()
                F.cross_entropy(self.model(x[rows]), y[rows]).backward()
                if clip is not None:
                    self.before.append(float(nn.utils.clip_grad_norm_(self.model.parameters(), clip)))
                    self.after.append(self.grad_norm())
                weights = [p.detach().clone() for p in self.model.parameters()]
                opt.step()
                moved = sum(float((p.detach() - w).pow(2).sum()) for p, w in zip(self.model.parameters(), weights))
                self.ratios.append(math.sqrt(moved / sum(float(w.pow(2).sum()) for w in weights)))

        self.dbg = support.watching(self.model, loop, watched)

    def grad_norm(self) -> float:
        return math.sqrt(sum(float(p.grad.pow(2).sum()) for p in self.model.parameters() if p.grad is not None))

    def accuracy(self) -> float:
        x, y = images(1000, seed=3)
        with torch.no_grad():
            return float((self.model(x).argmax(1) == y).float().mean())

    def stalls(self) -> list:
        assert self.dbg is not None
        return [h for h in self.dbg.hypotheses() if h.kind.value == "stalled_updates"]


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def test_sgd_clipped_to_a_tiny_norm_is_one_stall_whose_fix_is_the_clipping():
    plain, twin = Run(0.05, 1e-4, watched=False), Run(0.05, 1.0, watched=False)
    # plain torch: the optimizer gets a norm of 1e-4 where the backward pass left ~1, the weights move by ~1e-6 of
    # their norm a step, and the CNN stays at chance (0.25) while clipped at 1.0 it learns
    assert min(b / a for b, a in zip(plain.before, plain.after)) > 1000
    assert median(plain.ratios) < 1e-5
    assert plain.accuracy() < 0.35 and twin.accuracy() > 0.9

    watched = Run(0.05, 1e-4, watched=True)
    assert watched.ratios == plain.ratios  # the debugger changes nothing
    stalls = watched.stalls()
    assert len(stalls) == 1, watched.dbg.report()
    what, fix = stalls[0].explanation, stalls[0].suggestion
    assert "clipping" in what and "clip_grad_norm_" in fix, fix
    assert "learning rate" not in fix, fix

    healthy = Run(0.05, 1.0, watched=True)
    assert healthy.dbg is not None and healthy.dbg.healthy, healthy.dbg.report()


def test_a_learning_rate_far_too_low_unclipped_is_one_stall_whose_fix_is_the_learning_rate():
    plain = Run(2e-6, None, watched=False)
    assert median(plain.ratios) < 1e-5 and plain.accuracy() < 0.35  # plain torch: as stalled, without clipping
    watched = Run(2e-6, None, watched=True)
    stalls = watched.stalls()
    assert len(stalls) == 1, watched.dbg.report()
    assert "raise the learning rate" in stalls[0].suggestion and "clip" not in stalls[0].suggestion
