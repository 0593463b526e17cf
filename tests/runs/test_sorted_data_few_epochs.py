"""Data sorted by label over a few classes, never shuffled, trained for one epoch or three (sweep D: a GRU
classifier of three classes at 0.40 / 0.50 held-out accuracy against 0.86 / 0.93 shuffled). Each class is a block
of ~21 steps, longer than the dense phase's 16 fully observed steps: those all fall in the first class's block,
and the later observed steps, one every 16th or so, each stand for a stretch of steps. Counting observed steps
made the first class the top one of ~90 % of them, read as data of one class; each observed step now counts for
the steps it stands for. Ground truth is plain torch: the held-out accuracy far below the shuffled twin's, and the
batches' labels read directly. The shuffled twins stay silent."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

CLASSES, SAMPLES, BATCH = 3, 2048, 32


def data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of 12 steps of 4 channels; the label is the channel, of the first three, whose sum over the steps
    is the largest (the sweep's task)."""
    x = torch.randn(n, 12, 4, generator=torch.Generator().manual_seed(seed))
    return x, x[:, :, :CLASSES].sum(1).argmax(1)


class Classifier(nn.Module):
    """A GRU read at its last step, as the sweep's."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(4, 32, batch_first=True)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


class Run:
    """A GRU classifier trained with Adam for ``epochs`` over data stored sorted by label, shuffled or not."""

    def __init__(self, shuffle: bool, epochs: int, watched: bool) -> None:
        torch.manual_seed(0)
        self.model = Classifier()
        x, y = data(SAMPLES, seed=1)
        stored = torch.argsort(y, stable=True)  # one class after another, as the data were built
        x, y = x[stored], y[stored]
        opt = torch.optim.Adam(self.model.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(1)
        self.batches: list[torch.Tensor] = []

        def loop() -> None:
            for _ in range(epochs):
                order = torch.randperm(SAMPLES, generator=g) if shuffle else torch.arange(SAMPLES)
                for i in range(0, SAMPLES, BATCH):
                    rows = order[i : i + BATCH]
                    self.batches.append(y[rows])
                    opt.zero_grad()
                    F.cross_entropy(self.model(x[rows]), y[rows]).backward()
                    opt.step()

        self.dbg = support.watching(self.model, loop, watched)

    def accuracy(self) -> float:
        x, y = data(1000, seed=2)
        with torch.no_grad():
            return float((self.model(x).argmax(1) == y).float().mean())

    def top_share(self) -> float:
        """The share of its batch the most frequent class holds, on average over the batches."""
        return sum(float(torch.bincount(b).max()) / len(b) for b in self.batches) / len(self.batches)


def check(epochs: int) -> None:
    # the accuracies are read in plain torch from the watched models: the debugger does not change the training
    # (tests/runs/test_detect_unshuffled_data.py compares the losses with and without it)
    sorted_run, shuffled = Run(False, epochs, watched=True), Run(True, epochs, watched=True)
    assert sorted_run.top_share() > 0.95 and shuffled.top_share() < 0.6  # plain torch: batches of one class
    assert shuffled.accuracy() - sorted_run.accuracy() > 0.2, (sorted_run.accuracy(), shuffled.accuracy())
    assert sorted_run.dbg is not None and "unshuffled_data" in support.kinds(sorted_run.dbg), sorted_run.dbg.report()
    assert shuffled.dbg is not None and "unshuffled_data" not in support.kinds(shuffled.dbg), shuffled.dbg.report()


def test_one_epoch_of_data_sorted_by_three_classes_is_found_and_its_shuffled_twin_is_silent():
    check(epochs=1)


def test_three_epochs_of_data_sorted_by_three_classes_are_found_and_their_shuffled_twin_is_silent():
    check(epochs=3)
