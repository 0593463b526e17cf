"""What the class-index gate (the fit leaving at least half of the target's variance) protects: a balanced ordinal
rating 0..3 (the quartile of a score) has the same target profile as four balanced class indices (integers from 0,
a quarter of the samples each), and a model that fits it leaves a fifth of its variance, so only how poorly the loss
fits tells the two apart. The same quartiles numbered as unordered classes (1, 0, 3, 2) ask for a map that is not
monotone in the score: the regression leaves most of the variance and is found. (A CNN that learns four nominal
templates well enough leaves 11-15 %, below the ordinal rating: that one is not found, see docs/limitations.md.)
Ground truth is plain torch in each test."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

FEATURES, STEPS, BATCH = 16, 256, 32
Batch = tuple[torch.Tensor, torch.Tensor]


def quartiles(n: int, seed: int, numbering: tuple[int, ...] = (0, 1, 2, 3)) -> Batch:
    """The quartile of a noisy linear score of the first four features, numbered by ``numbering``: in order, an
    ordinal rating 0..3."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    score = x[:, :4].sum(1) + 0.5 * torch.randn(n, generator=g)
    quartile = torch.bucketize(score, 0.6745 * math.sqrt(4.25) * torch.tensor([-1.0, 0.0, 1.0]))
    return x, torch.tensor(numbering)[quartile]


def unordered(n: int, seed: int) -> Batch:
    """The same quartiles as class labels numbered without regard to their order."""
    return quartiles(n, seed, (1, 0, 3, 2))


def train(make: Callable[[int, int], Batch]) -> tuple[NeuralDbg, float, float]:
    """MSE of one output on the integer target; the last quarter's mean loss over the target's variance, and the
    held-out accuracy of the rounded prediction."""
    torch.manual_seed(0)
    (x, y), held_out = make(STEPS * BATCH, 1), make(1000, 2)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    with NeuralDbg(model) as dbg:
        for step in range(STEPS):
            xs, ys = x[step * BATCH : (step + 1) * BATCH], y[step * BATCH : (step + 1) * BATCH]
            loss = F.mse_loss(model(xs).squeeze(1), ys.float())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    with torch.no_grad():
        rounded = model(held_out[0]).squeeze(1).round().clamp(0, int(y.max()))
    end = sum(losses[-STEPS // 4 :]) / (STEPS // 4)
    return dbg, end / float(y.float().var()), float((rounded == held_out[1]).float().mean())


def test_a_balanced_ordinal_rating_the_model_fits_is_not_class_indices():
    dbg, unexplained, accuracy = train(quartiles)
    # plain torch: each of the four values holds a quarter of the targets, as balanced class indices would, and the
    # fit leaves a fifth of their variance
    share = torch.bincount(quartiles(STEPS * BATCH, 1)[1]).float() / (STEPS * BATCH)
    assert len(share) == 4 and bool((share - 0.25).abs().max() < 0.02)
    assert 0.1 < unexplained < 0.3 and accuracy > 0.65, (unexplained, accuracy)
    assert dbg._recorder.coverage.regression_target[:3] == (1.0, 0.0, 3.0)  # the target was profiled
    assert FailureKind.CLASS_INDEX_REGRESSION not in {h.kind for h in dbg.hypotheses()}, dbg.report()


def test_the_same_quartiles_numbered_as_unordered_classes_are_found():
    dbg, unexplained, accuracy = train(unordered)
    # plain torch: the same inputs and bins, the regression leaves most of the variance and rounds far worse
    assert 0.6 < unexplained < 0.95 and accuracy < 0.5, (unexplained, accuracy)
    assert FailureKind.CLASS_INDEX_REGRESSION in {h.kind for h in dbg.hypotheses()}, dbg.report()


def counts(n: int, seed: int) -> Batch:
    """Poisson counts (rentals an hour, say) whose rate grows with the first feature: integers from 0, most of them
    small, a long tail."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    rate = 3.0 * torch.exp(0.5 * x[:, 0])
    return x, torch.poisson(rate, generator=g).long()


def test_poisson_counts_a_model_fits_to_their_noise_floor_are_not_class_indices():
    """Sweep E of the eighteenth session: a count regression under MSE was told its counts were class indices. A
    count's own noise leaves most of its variance to any fit (the best possible MSE is the mean of its rates), and
    counts pile up at a few small values where class labels spread over their classes."""
    dbg, unexplained, _ = train(counts)
    x, y = counts(STEPS * BATCH, 1)
    rate = 3.0 * torch.exp(0.5 * x[:, 0])
    best = float(rate.mean() / y.float().var())  # the Poisson noise: the least any fit can leave
    values = int(y.max()) + 1
    even = float(y.float().var()) / ((values * values - 1) / 12)
    # plain torch: no fit can explain more than half of the variance, and this one is near that floor; the counts
    # are far from spread evenly over 0..max
    assert best > 0.5 and unexplained < best + 0.15, (best, unexplained)
    assert even < 0.5, even
    assert dbg._recorder.coverage.regression_target[:2] == (1.0, 0.0)  # integers from 0, profiled
    assert FailureKind.CLASS_INDEX_REGRESSION not in {h.kind for h in dbg.hypotheses()}, dbg.report()
