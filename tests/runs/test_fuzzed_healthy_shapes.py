"""Healthy shapes the fuzzer found alarms on: batch-1 nested sigmoid nets under SGD at lr 0.1 (once called
exploding at a largest layer gradient norm of 355), and GRU + LayerNorm + tanh stacks (once called saturated).

Ground truth by plain torch on the same runs: every layer gradient finite and no runaway (the largest layer gradient
norm of the last quarter no larger than that of the first), the loss not worse at the end than at the start; for the
recurrent stack, the loss falls at least threefold and under a fifth of the tanh outputs are saturated (|y| > 0.99)
at the end."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import pytest
import support
import torch
from support import layer_gradients
from torch import nn

from neuraldbg import FailureKind, NeuralDbg


def nested_sigmoid(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(16, 24),
        nn.Sequential(nn.Sigmoid(), nn.Sequential(nn.Linear(24, 24), nn.Sigmoid()), nn.Linear(24, 24)),
        nn.Sigmoid(),
        nn.Sequential(nn.Linear(24, 24), nn.Sigmoid()),
        nn.Linear(24, 1),
    )


class RecurrentNormStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.gru = nn.GRU(32, 32, batch_first=True)
        self.ln = nn.LayerNorm(32)
        self.act = nn.Tanh()
        self.gru2 = nn.GRU(32, 32, batch_first=True)
        self.ln2 = nn.LayerNorm(32)
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.ln(self.gru(self.inp(x))[0]))
        h = self.act(self.ln2(self.gru2(h)[0]))
        return self.head(h[:, -1])


def run(
    model: nn.Module, batches: Callable[[int], support.Batch], opt: torch.optim.Optimizer, steps: int
) -> tuple[NeuralDbg, list[float], list[float]]:
    """Returns the debugger, the losses and the largest layer gradient norm per step (plain torch)."""
    losses: list[float] = []
    tops: list[float] = []
    with NeuralDbg(model) as dbg:
        for step in range(steps):
            x, y = batches(step)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            tops.append(max(layer_gradients(model).values()))
            opt.step()
            losses.append(loss.item())
    return dbg, losses, tops


@pytest.mark.parametrize("seed", range(2))
def test_batch_one_nested_sigmoid_nets_under_sgd_are_silent(seed: int) -> None:
    model = nested_sigmoid(seed)
    steps = 200
    teacher = support.regression_batches(batch=1, seed=seed)

    def batches(step: int) -> support.Batch:
        x, y = teacher(step)
        return x, y / 4  # targets of unit scale (the teacher's sum over 16 inputs has a std of 4)

    dbg, losses, tops = run(model, batches, torch.optim.SGD(model.parameters(), lr=0.1), steps)
    quarter = steps // 4
    assert all(torch.isfinite(torch.tensor(tops)))
    assert max(tops[-quarter:]) <= max(tops[:quarter])  # no runaway: batch-1 noise, not an explosion
    assert statistics.fmean(losses[-quarter:]) <= statistics.fmean(losses[:quarter])
    # the alarms the fuzzer raised were at the gradients; whether such a noisy batch-1 loss falls enough is the
    # loss-level findings' judgement, not this test's
    assert not {FailureKind.EXPLODING_GRADIENTS, FailureKind.VANISHING_GRADIENTS} & {h.kind for h in dbg.hypotheses()}


@pytest.mark.parametrize("seed", range(2))
def test_gru_layernorm_tanh_stacks_are_silent(seed: int) -> None:
    torch.manual_seed(seed)
    model = RecurrentNormStack()
    saturated: list[float] = []
    model.act.register_forward_hook(lambda m, i, o: saturated.append(float((o.abs() > 0.99).float().mean())))
    dbg, losses, _ = run(
        model, support.sequence_batches(batch=4, seed=seed), torch.optim.Adam(model.parameters(), lr=1e-3), 150
    )
    assert statistics.fmean(losses[-30:]) < statistics.fmean(losses[:20]) / 3
    assert statistics.fmean(saturated[-20:]) < 0.2
    assert dbg.hypotheses() == []
