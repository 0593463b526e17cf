"""Labels shuffled apart from their inputs, in the loop users write most: a DataLoader over a fixed training set,
reshuffled every epoch. No batch holds new and seen samples together (the first epoch is all new, the next ones all
seen), so the same-step comparison of test_detect_memorised_labels.py has nothing to compare; the loss stays at
chance through the first epoch and then falls in steps, where each epoch starts. Ground truth is plain torch: held-out
accuracy against the twin with its labels, and the loss curve. The twins must stay silent: the same program with its
labels, a slow learner, labels half noise (it learns the other half), and a parity task at chance for its whole first
epoch that it then learns."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

SAMPLES = 2048
BATCH = 64  # 32 steps an epoch


def blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four classes given by a fixed linear teacher over 20 features, with noise."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(20, 4, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(n, 20, generator=g)
    return x, (x @ teacher + 0.5 * torch.randn(n, 4, generator=g)).argmax(1)


def parity(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The parity of the first 4 of 12 bits: nothing to learn from any single bit, so a model sits at chance a while."""
    x = torch.randint(0, 2, (n, 12), generator=torch.Generator().manual_seed(seed)).float()
    return x * 2 - 1, (x[:, :4].sum(1) % 2).long()


def train(case: str, watched: bool, seed: int = 0, epochs: int = 8) -> tuple[list[float], float, NeuralDbg | None, int]:
    """A user's epoch loop; the losses, the held-out accuracy, the debugger (when watched) and the classes."""
    torch.manual_seed(seed)
    make, classes = (parity, 2) if case == "parity" else (blobs, 4)
    x, y = make(SAMPLES + 2048, seed)
    x, y, held_x, held_y = x[:SAMPLES], y[:SAMPLES], x[SAMPLES:], y[SAMPLES:]
    if case == "shuffled":
        y = y[torch.randperm(SAMPLES)]
    if case == "half_noise":
        noisy = torch.rand(SAMPLES) < 0.5
        y = torch.where(noisy, torch.randint(0, classes, (SAMPLES,)), y)
    model = nn.Sequential(
        nn.Linear(x.shape[1], 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, classes)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-4 if case == "slow" else 1e-3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    losses: list[float] = []

    def loop() -> None:
        for _ in range(epochs):
            for xb, yb in loader:
                loss = F.cross_entropy(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())

    dbg = None
    if watched:
        with NeuralDbg(model) as dbg:
            loop()
    else:
        loop()
    with torch.no_grad():
        accuracy = (model(held_x).argmax(1) == held_y).float().mean().item()
    return losses, accuracy, dbg, classes


def epoch_means(losses: list[float]) -> list[float]:
    per_epoch = SAMPLES // BATCH
    return [sum(losses[i : i + per_epoch]) / per_epoch for i in range(0, len(losses), per_epoch)]


def test_shuffled_labels_in_an_epoch_loop_are_found_as_memorised():
    plain, accuracy, _, classes = train("shuffled", watched=False)
    _, twin_accuracy, _, _ = train("healthy", watched=False)
    # plain torch: held-out predictions a guess against the twin's; the first epoch at chance, then lower each epoch
    assert accuracy < 0.35 < 0.8 < twin_accuracy
    means = epoch_means(plain)
    assert means[0] == pytest.approx(math.log(classes), rel=0.03)
    assert all(b < a for a, b in itertools.pairwise(means[1:]))
    assert means[-1] < 0.9 * math.log(classes)  # under the band of chance: the run-level band alone misses it

    watched, _, dbg, _ = train("shuffled", watched=True)
    assert watched == plain  # the debugger changed nothing
    assert dbg is not None
    top = dbg.hypotheses()[0]
    assert top.kind.value == "loss_at_chance", dbg.explain_failure()
    assert top.root.metrics["epoch_steps"] == SAMPLES // BATCH and top.root.metrics["epoch_starts"] == 7
    assert "fell only where each epoch started" in top.explanation
    assert "labels that do not match the inputs" in top.explanation


@pytest.mark.parametrize("case", ["healthy", "slow", "half_noise", "parity"])
def test_twins_that_learn_from_their_inputs_stay_silent(case: str):
    epochs = 12 if case == "parity" else 8
    plain, accuracy, _, classes = train(case, watched=False, epochs=epochs)
    assert accuracy > 0.65  # plain torch: every twin predicts held-out samples far better than a guess
    if case == "parity":  # at chance through its whole first epoch, then learned
        assert epoch_means(plain)[0] == pytest.approx(math.log(classes), rel=0.05)
    watched, _, dbg, _ = train(case, watched=True, epochs=epochs)
    assert watched == plain
    assert dbg is not None and dbg.healthy, dbg.explain_failure()
