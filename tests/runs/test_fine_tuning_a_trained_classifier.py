"""A classifier met already trained, fine-tuned under a new optimizer, whose loss stays at the floor it reached is
not "a model that cannot learn" (``loss_evidence.met_trained``).

A fine-tuning script builds its own optimizer, so no optimizer state says the model trained before (as it does for
a resumed run). Ground truth by plain torch in the test: the MLP is trained to its floor on 5 classes with noisy
labels, its first fine-tuning losses are far below log(5), the level of an untrained classifier, and they do not
fall (by less than their batch-to-batch spread); a fresh twin trained as long ends at the same floor. A fresh
classifier whose loss stays flat is still reported: ``tests/runs/test_detect_loss.py``."""

from __future__ import annotations

import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

CLASSES = 5


def setup() -> tuple[nn.Module, torch.Generator, torch.Tensor]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(20, CLASSES, generator=g)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    return model, g, weights


def batch(g: torch.Generator, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(64, 20, generator=g)
    return x, (x @ weights + 0.5 * torch.randn(64, CLASSES, generator=g)).argmax(1)  # labels with noise


def train(model: nn.Module, opt: torch.optim.Optimizer, g: torch.Generator, w: torch.Tensor, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        x, y = batch(g, w)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def test_fine_tuning_a_classifier_trained_to_its_floor_is_not_called_not_learning():
    model, g, w = setup()
    train(model, torch.optim.Adam(model.parameters(), lr=1e-3), g, w, 1500)
    with NeuralDbg(model) as dbg:  # the fine-tuning script: a new optimizer
        losses = train(model, torch.optim.AdamW(model.parameters(), lr=1e-3), g, w, 300)
    start, end = statistics.fmean(losses[:40]), statistics.fmean(losses[-75:])
    spread = statistics.stdev(losses)
    # plain torch: far below an untrained classifier's loss, and flat at that level
    assert start < 0.2 * math.log(CLASSES)
    assert abs(start - end) < spread
    twin, tg, tw = setup()
    twin_losses = train(twin, torch.optim.Adam(twin.parameters(), lr=1e-3), tg, tw, 1800)
    assert abs(statistics.fmean(twin_losses[-75:]) - end) < spread  # a fresh twin trained as long: the same floor
    assert dbg.hypotheses() == []


def test_met_trained_needs_a_cross_entropy_far_below_chance():
    from types import SimpleNamespace

    from neuraldbg.kinds.loss_evidence import met_trained

    def judge(first: float, classes: int, loss: str = "cross_entropy", probabilities: bool | None = None) -> bool:
        coverage = SimpleNamespace(
            classifier_loss=loss,
            mixture_loss=False,
            classifier_mean=True,
            loss_options=float(classes),
            baseline_kind="",
            regression_target=(),
            label_classes=0,
            target_baseline=(),
            training=SimpleNamespace(classes=classes, probabilities=probabilities),
        )
        return met_trained(coverage, SimpleNamespace(start=SimpleNamespace(mean=first)))  # type: ignore[arg-type]

    assert judge(0.19, 5)  # 0.12 log 5: trained before
    assert not judge(0.9, 5)  # 0.56 log 5: not far enough below chance
    assert not judge(1.6, 5)  # at chance: an untrained classifier
    assert not judge(0.19, 5, loss="")  # no cross-entropy in the loss graph (a regression with 5 outputs)
    assert judge(0.1, 1, probabilities=True)  # a binary classifier's sigmoid: log 2
    assert not judge(0.1, 1, probabilities=False)  # one output that is no probability: a regression
