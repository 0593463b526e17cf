"""LossTrace keeps the sums of the losses' logarithms beside the losses' own: the mean and spread of the logarithms
over any stretch of blocks, and their batch-to-batch noise, against a brute-force computation over the losses the
blocks hold (blocks merged many times over: 300 losses in at most 64 blocks)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from neuraldbg.stats.losses import LossTrace, combine


def heavy_tailed(n: int) -> list[float]:
    rng = random.Random(0)
    return [math.exp(rng.gauss(0.0, 1.0)) * (50.0 if rng.random() < 0.03 else 1.0) for _ in range(n)]


def test_the_logarithms_of_a_stretch_of_blocks_have_the_mean_and_spread_of_its_losses_logarithms() -> None:
    losses = heavy_tailed(300)
    trace = LossTrace()
    for step, value in enumerate(losses):
        trace.add(step, value)
    assert trace.positive and trace.size > 1
    blocks = trace.blocks[int(0.5 * len(trace.blocks)) :]  # the second half, as local_noise(0.5) takes it
    stretch = combine(blocks, log=True)
    assert stretch is not None
    logs = [math.log(v) for v in losses[blocks[0].first : blocks[-1].last + 1]]
    assert (stretch.n, stretch.first, stretch.last) == (len(logs), blocks[0].first, blocks[-1].last)
    assert stretch.mean == pytest.approx(statistics.fmean(logs))
    assert stretch.sd == pytest.approx(statistics.stdev(logs))

    # the noise of the second half: the consecutive differences of logarithms that end in its blocks
    diffs = [math.log(losses[i] / losses[i - 1]) for i in range(blocks[0].first, blocks[-1].last + 1)]
    noise = math.sqrt(statistics.fmean(d * d for d in diffs) / 2)
    assert trace.local_noise(0.5, log=True) == pytest.approx(noise)


def test_a_loss_that_was_zero_or_negative_on_some_step_is_not_positive() -> None:
    for low in (0.0, -0.5):
        trace = LossTrace()
        for step, value in enumerate([1.0, 0.5, low, 0.25]):
            trace.add(step, value)
        assert not trace.positive
    assert not LossTrace().positive  # no loss yet
