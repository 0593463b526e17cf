"""A loss that stayed positive "stopped falling" (``unstable_loss``) is judged by factors, on the log scale.

The program: pytorch/examples' polynomial regression as in ``tests/healthy_families.py`` (a Linear(4, 1) on x,
x^2, x^3, x^4, hand-written SGD at 0.1, smooth-L1), with its seed shifted by 1000 and more. Its loss is heavy
tailed: a rare batch with a large x (x^4 in the hundreds) is many times the typical loss, so its batch-to-batch
spread exceeds its own level, and on its own scale it could never fall by one spread however many times it
halved. Plain torch decides which seed is harmed: the loss of the second half (the geometric means of its first
and last thirds), the same program at a lower learning rate (the alarm's fix) over the last quarter, and the
loss of both on a held-out batch of 4,096 samples.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import statistics

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 300


def features(x: torch.Tensor) -> torch.Tensor:
    x = x.unsqueeze(1)
    return torch.cat([x**i for i in range(1, 5)], 1)


def run(seed: int, lr: float, watch: bool) -> tuple[NeuralDbg | None, list[float], float]:
    """The polynomial regression at this seed and learning rate; returns the debugger (when watched), the losses
    and the loss on a held-out batch after training (plain torch)."""
    torch.manual_seed(seed)
    w_target, b_target = torch.randn(4, 1) * 5, torch.randn(1) * 5
    fc = nn.Linear(4, 1)
    losses: list[float] = []
    dbg = NeuralDbg(fc) if watch else None
    with dbg if dbg is not None else contextlib.nullcontext():
        for _ in range(STEPS):
            x = features(torch.randn(32))
            y = x.mm(w_target) + b_target.item()
            fc.zero_grad()
            loss = F.smooth_l1_loss(fc(x), y)
            loss.backward()
            with torch.no_grad():
                for param in fc.parameters():
                    param.add_(-lr * param.grad)  # type: ignore[operator]
            losses.append(loss.item())
    x = features(torch.randn(4096, generator=torch.Generator().manual_seed(12345)))
    with torch.no_grad():
        held_out = F.smooth_l1_loss(fc(x), x.mm(w_target) + b_target.item()).item()
    return dbg, losses, held_out


def second_half(losses: list[float]) -> tuple[float, float]:
    """The geometric means of the first and the last third of the second half."""
    half = losses[len(losses) // 2 :]
    third = len(half) // 3
    return (
        math.exp(statistics.fmean(math.log(v) for v in half[:third])),
        math.exp(statistics.fmean(math.log(v) for v in half[-third:])),
    )


def spread(losses: list[float]) -> float:
    """The batch-to-batch spread of the second half on the loss's own scale (the debugger's noise)."""
    half = losses[len(losses) // 2 :]
    return math.sqrt(statistics.fmean((b - a) ** 2 for a, b in itertools.pairwise(half)) / 2)


def test_a_heavy_tailed_loss_that_still_falls_by_factors_is_not_called_unstable() -> None:
    dbg, losses, held_out = run(1000, 0.1, watch=True)
    _, slower, slower_held_out = run(1000, 0.01, watch=False)
    assert dbg is not None
    quarter = STEPS // 4

    # plain torch: over its second half the loss falls 2.6-fold, by less than its batch-to-batch spread on its own
    # scale; the learning rate 10x lower ends 6x worse over the last quarter, and far worse on a held-out batch
    first, last = second_half(losses)
    assert last < 0.5 * first
    half = losses[STEPS // 2 :]
    third = len(half) // 3
    assert statistics.fmean(half[:third]) - statistics.fmean(half[-third:]) < spread(losses)
    assert statistics.fmean(slower[-quarter:]) > 5 * statistics.fmean(losses[-quarter:])
    assert slower_held_out > 20 * held_out

    assert FailureKind.UNSTABLE_LOSS not in {h.kind for h in dbg.hypotheses()}, dbg.report()
    assert dbg.hypotheses() == []


@pytest.mark.xfail(
    strict=True,
    reason="a known miss: its loss rises 1.3-fold over its second half, within its batch-to-batch spread by factors "
    "(3x), and its updates are 3-4 % of the weights per step (over the steps of the first quarter and of the second "
    "half; the largest 24 %): no evidence of steps too large that a run at its right learning rate lacks. It was "
    "found while the update ratio 'over the first quarter' was read over the first quarter of the fully observed "
    "steps (its first 8 steps, whose weights were still far below their solution's), which also told a skip-gram "
    "model starting from small embeddings to lower its learning rate",
)
def test_a_heavy_tailed_loss_that_rises_over_its_second_half_is_still_unstable() -> None:
    dbg, losses, held_out = run(1008, 0.1, watch=True)
    _, slower, slower_held_out = run(1008, 0.1 / 3, watch=False)
    assert dbg is not None
    quarter = STEPS // 4

    # plain torch: over its second half the loss rises 1.7-fold; the learning rate 3x lower ends 2x better over
    # the last quarter and on a held-out batch
    first, last = second_half(losses)
    assert last > 1.5 * first
    assert statistics.fmean(slower[-quarter:]) < 0.6 * statistics.fmean(losses[-quarter:])
    assert slower_held_out < 0.5 * held_out

    hypotheses = dbg.hypotheses()
    assert hypotheses and hypotheses[0].kind is FailureKind.UNSTABLE_LOSS, dbg.report()
    words = hypotheses[0].explanation
    assert "The loss stopped falling" in words and "the factor it moves by from batch to batch" in words
    assert "lower the learning rate" in (words + hypotheses[0].suggestion)
