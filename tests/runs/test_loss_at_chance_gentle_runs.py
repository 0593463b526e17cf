"""A classifier given shuffled labels whose updates add up to less than ``loss_trained`` (a gentle Adam run): its
loss began at chance and ends there, after updates that would have taken a learnable task off chance twice over,
so it is at chance; the same run on true labels leaves chance and is silent, and a run too gentle to have left
chance even on true labels is not judged. Ground truth is plain torch: the loss's windows against log(10), the
summed update ratios, and the healthy twin's fall."""

from __future__ import annotations

import math

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.config import DebugConfig
from neuraldbg.kinds import loss_evidence

CHANCE = math.log(10)
learnable = support.classification_batches((32,), 10, batch=64)


def shuffled(step: int) -> support.Batch:
    x, y = learnable(step)
    return x, y[torch.randperm(len(y), generator=torch.Generator().manual_seed(7000 + step))]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def train(make, lr: float, steps: int, watched: bool) -> tuple[list[float], NeuralDbg | None]:
    """A 32-64-10 MLP under Adam, a user's loop: the losses, and the debugger when watched."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses: list[float] = []
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.__enter__()
    for step in range(steps):
        x, y = make(step)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    if dbg is not None:
        dbg.__exit__(None, None, None)
    return losses, dbg


def test_shuffled_labels_at_chance_under_a_gentle_run_are_found_and_the_true_labels_twin_is_silent():
    losses, _ = train(shuffled, 3e-4, 300, watched=False)
    assert abs(mean(losses[:8]) - CHANCE) < 0.05 * CHANCE and abs(mean(losses[-75:]) - CHANCE) < 0.05 * CHANCE
    twin, _ = train(learnable, 3e-4, 300, watched=False)
    assert mean(twin[-75:]) < 0.85 * CHANCE  # plain torch: the same run on true labels leaves chance
    _, dbg = train(shuffled, 3e-4, 300, watched=True)
    assert dbg is not None
    curve = loss_evidence.judged(dbg._recorder.coverage, DebugConfig())
    assert curve is not None and loss_evidence.CHANCE_TRAINED <= curve.trained < DebugConfig().loss_trained
    assert [h.kind.value for h in dbg.hypotheses()][:1] == ["loss_at_chance"], dbg.explain_failure()
    _, healthy = train(learnable, 3e-4, 300, watched=True)
    assert healthy is not None and healthy.healthy, healthy.explain_failure()


def test_a_run_too_gentle_to_have_left_chance_on_true_labels_is_not_judged():
    twin, _ = train(learnable, 1e-4, 200, watched=False)
    assert mean(twin[-50:]) > 0.95 * CHANCE  # plain torch: on true labels too it is still at chance
    _, dbg = train(shuffled, 1e-4, 200, watched=True)
    assert dbg is not None and dbg.healthy, dbg.explain_failure()
