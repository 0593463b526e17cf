"""A learning rate 100x too high whose oversized updates last only a few steps is still found.

A tiny vision transformer under AdamW at 0.1 (its twin trains at 1e-3): Adam moves every weight by about the
learning rate, so the first steps rewrite the weights (95 %, 49 %, 30 % ... of their size) and the loss jumps
(1.6, 2.0, 4.6, 1.9, 2.7); as the weights grow, the same step is a smaller share of them, and after six steps the
updates fall below a tenth. The loss then sits at chance for tens of steps and never gets near the twin's. The
surge detector's rise of the loss, judged over the surge's own steps, is clear only at its fifth step: the whole
surge counts from there (``Finding.confirms_run``), not only the two solid steps left of it, fewer than the
persistence a state needs; its explanation names the largest updates of the surge beside those of the step it
reports.
"""

from __future__ import annotations

import re
import statistics

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 120


class TinyViT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 32, 4, 4)
        self.cls = nn.Parameter(torch.zeros(1, 1, 32))
        self.pos = nn.Parameter(torch.randn(1, 17, 32) * 0.02)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True, norm_first=True, activation="gelu")
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(len(x), -1, -1), patches], 1) + self.pos
        return self.head(self.norm(self.enc(h)[:, 0]))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four classes, each a bright band in one colour channel and half of the image, on noise; fresh every step."""
    g = torch.Generator().manual_seed(step)
    y = torch.randint(0, 4, (32,), generator=g)
    x = torch.randn(32, 3, 16, 16, generator=g) * 0.5
    for k in range(4):
        x[y == k, k % 3, (k // 2) * 8 : (k // 2) * 8 + 8, :] += 1.0
    return x, y


def run(lr: float, watch: bool) -> tuple[NeuralDbg | None, list[float], list[float]]:
    """The debugger (when watched), the losses and, per step, the median over the weight matrices of ||dW|| / ||W||
    before the step (plain torch)."""
    torch.manual_seed(0)
    model = TinyViT()
    torch.manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    matrices = [p for p in model.parameters() if p.dim() > 1]
    return support.train_measuring_updates(model, batch, F.cross_entropy, STEPS, opt, matrices, watch)


def test_a_few_steps_of_updates_as_large_as_the_weights_that_threw_the_loss_up_are_oversized_updates() -> None:
    _, losses, ratios = run(0.1, watch=False)
    _, twin, _ = run(1e-3, watch=False)
    # plain torch: the updates are a tenth of the weights or more for a handful of steps only ...
    surge = [step for step, r in enumerate(ratios) if r > 0.1]
    assert surge == list(range(len(surge))) and 4 <= len(surge) <= 7
    # ... the loss rose over them ...
    assert max(losses[1 : len(surge)]) > 2 * losses[0]
    # ... and the run never recovers: its last quarter is far worse than the twin's
    quarter = STEPS // 4
    assert statistics.fmean(losses[-quarter:]) > 5 * statistics.fmean(twin[-quarter:])

    dbg, watched, _ = run(0.1, watch=True)
    assert dbg is not None
    assert watched == losses  # the debugger changes nothing of the training
    (top, *_) = dbg.hypotheses()
    assert top.kind is FailureKind.OVERSIZED_UPDATES
    assert top.root.step_start == 0
    words = dbg.explain_failure()[0]
    assert "the loss rose from" in words
    # the explanation names the surge's largest updates, at its first step, not only the later step it reports
    largest = re.search(r"up to (\d+)% of their size at step (\d+)", words)
    assert largest is not None, words
    assert int(largest.group(2)) == 0 and abs(int(largest.group(1)) / 100 - ratios[0]) < 0.2 * ratios[0]


def test_the_twins_at_sound_learning_rates_stay_silent() -> None:
    """At 1e-3 and at 1e-2 the twins learn (plain torch: their last quarter's loss far below chance, log 4); at
    1e-2 the very first step still moves the weights by a tenth of their size, and nothing is found."""
    for lr in (1e-3, 1e-2):
        dbg, losses, _ = run(lr, watch=True)
        assert dbg is not None
        assert statistics.fmean(losses[-(STEPS // 4) :]) < 0.25
        assert dbg.explain_failure() == [], (lr, dbg.explain_failure())
