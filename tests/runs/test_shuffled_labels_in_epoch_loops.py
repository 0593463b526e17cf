"""Labels shuffled apart from their inputs, in the loop users write most: a DataLoader over a fixed training set,
reshuffled every epoch. No batch holds new and seen samples together (the first epoch is all new, the next ones all
seen), so the same-step comparison of test_detect_memorised_labels.py has nothing to compare, and a run whose loss
leaves the 5 % band of chance by memorising is not reported: a known miss (docs/limitations.md), kept here as a strict
xfail with its plain-torch truth.

A rule that read such a loop by its epochs (the loss at chance through the first epoch, then falling where each epoch
starts and not amid them) was tried and dropped: a healthy classifier that learns slowly and memorises a little
falls the same way, since a sample met early in an epoch was last seen half an epoch before on average and one met
late one and a half. Hunt 22's Dropout(0.5) MLP below, whose first epoch sits at chance and which predicts held-out
samples far better than a guess, was told its labels did not match its inputs; it must stay silent."""

from __future__ import annotations

import math

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

SAMPLES = 2048
BATCH = 64  # 32 steps an epoch
EPOCHS = 10


def train(shuffled: bool, watched: bool, dropout: float = 0.5) -> tuple[list[float], float, NeuralDbg | None]:
    """Four classes from two nonlinear features of 16 (the signs of x0 x1, the radius of x2 and x3), an MLP
    16-256-256-4 with Dropout(``dropout``), Adam 1e-3, ten epochs: the losses, the held-out accuracy, the debugger."""
    torch.manual_seed(0)
    x = torch.randn(SAMPLES + 1024, 16)
    y = (x[:, 0] * x[:, 1] > 0).long() * 2 + (x[:, 2] ** 2 + x[:, 3] ** 2 > 1.4).long()
    x, y, held_x, held_y = x[:SAMPLES], y[:SAMPLES], x[SAMPLES:], y[SAMPLES:]
    model = nn.Sequential(
        nn.Linear(16, 256),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(256, 4),
    )
    if shuffled:
        y = y[torch.randperm(SAMPLES)]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    losses: list[float] = []

    def loop() -> None:
        for _ in range(EPOCHS):
            model.train()
            for xb, yb in loader:
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
                losses.append(loss.item())

    dbg = support.watching(model, loop, watched)
    model.eval()
    with torch.no_grad():
        accuracy = (model(held_x).argmax(1) == held_y).float().mean().item()
    return losses, accuracy, dbg


def epoch_means(losses: list[float]) -> list[float]:
    per_epoch = SAMPLES // BATCH
    return [sum(losses[i : i + per_epoch]) / per_epoch / math.log(4) for i in range(0, len(losses), per_epoch)]


def test_a_slow_healthy_classifier_whose_first_epoch_sits_at_chance_is_silent():
    plain, accuracy, _ = train(shuffled=False, watched=False)
    means = epoch_means(plain)
    # plain torch: at chance through its first epoch, then learned from the inputs
    assert means[0] == pytest.approx(1.0, abs=0.02) and accuracy > 0.7
    watched, _, dbg = train(shuffled=False, watched=True)
    assert watched == plain
    assert dbg is not None and dbg.healthy, dbg.explain_failure()


@pytest.mark.xfail(
    strict=True,
    reason="known miss: shuffled labels in an epoch loop whose loss memorises out of the 5 % band of chance are "
    "not told from a slow start (docs/limitations.md)",
)
def test_shuffled_labels_in_an_epoch_loop_that_memorises_out_of_the_band():
    plain, accuracy, _ = train(shuffled=True, watched=False, dropout=0.0)
    # plain torch: held-out predictions a guess; the training loss below the band by the end
    assert accuracy < 0.35 and 0.6 < epoch_means(plain)[-1] < 0.9
    watched, _, dbg = train(shuffled=True, watched=True, dropout=0.0)
    assert watched == plain
    assert dbg is not None and not dbg.healthy
