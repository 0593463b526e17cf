"""Labels shuffled once apart from a fixed training set that is seen for several epochs: the model starts to
memorise them, so its training loss falls below log(classes) while its predictions on unseen inputs stay a guess.
The real programs of the benchmark (`mlp.labels_shuffled`, `siamese.pair_labels_random`) end this way, a few
percent under chance; the synthetic random-labels test of test_detect_loss.py draws fresh labels every step and
never memorises. Ground truth is plain torch: held-out accuracy, and the training loss against log(classes)."""

from __future__ import annotations

import math

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

CLASSES = 10
FEATURES = 32
SAMPLES = 3072  # 48 steps of 64 per epoch: 120 steps see every sample two or three times
BATCH = 64
STEPS = 120
LOSS_KINDS = {"loss_at_chance", "loss_not_decreasing", "unstable_loss"}


def dataset(shuffled: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed training set labelled by a linear teacher (its labels permuted once when ``shuffled``) and a
    held-out set labelled by the same teacher."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    teacher = torch.randn(FEATURES, CLASSES, generator=g)
    y = (x @ teacher).argmax(dim=1)
    if shuffled:
        y = y[torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(2))]
    held_x = torch.randn(1024, FEATURES, generator=g)
    return x, y, held_x, (held_x @ teacher).argmax(dim=1)


def train(shuffled: bool, seed: int) -> tuple[NeuralDbg, list[float], float]:
    """A user's epoch loop over the fixed set, under NeuralDBG: the debugger, the losses, held-out accuracy."""
    x, y, held_x, held_y = dataset(shuffled)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses = []
    with NeuralDbg(model) as dbg:
        for step in range(STEPS):
            i = (step * BATCH) % SAMPLES
            opt.zero_grad()
            loss = F.cross_entropy(model(x[i : i + BATCH]), y[i : i + BATCH])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    with torch.no_grad():
        accuracy = (model(held_x).argmax(dim=1) == held_y).float().mean().item()
    return dbg, losses, accuracy


@pytest.mark.parametrize("seed", [0, 1])
def test_labels_memorised_a_little_below_chance_are_still_a_loss_at_chance(seed):
    chance = math.log(CLASSES)
    dbg, losses, accuracy = train(shuffled=True, seed=seed)
    twin, twin_losses, twin_accuracy = train(shuffled=False, seed=seed)

    # plain torch: the shuffled labels are not learned (held-out accuracy near 1/10, the twin's far above) ...
    assert accuracy < 0.2 < 0.5 < twin_accuracy
    # ... yet the training loss fell below log(10) by memorising: it ended 1-5 % under chance, not at it
    start, end = sum(losses[:15]) / 15, sum(losses[-30:]) / 30
    assert start - end > 0.03
    assert 0.95 * chance < end < 0.99 * chance
    assert sum(twin_losses[-30:]) / 30 < 0.6 * chance

    found = dbg.hypotheses()
    assert found and found[0].kind is FailureKind.LOSS_AT_CHANCE, dbg.report()
    assert "label" in found[0].explanation.lower()
    assert not support.kinds(twin) & LOSS_KINDS, twin.report()
