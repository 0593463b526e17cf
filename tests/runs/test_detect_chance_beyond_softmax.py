"""A loss at chance beyond a softmax cross-entropy: a model whose inputs say nothing about its targets learns what
they are on average and no more. A mean squared error then settles at the targets' variance (per output column:
the loss of predicting each column's mean, R^2 about 0), a multi-label binary cross-entropy at the mean binary
entropy of the labels' base rates (each label predicted with its frequency). The targets of the first backward
passes are profiled on the device for it. Ground truth is plain torch in each test (held-out R^2 or F1, the loss
at the variance or the base-rate entropy); the twins whose targets match their inputs (one of them a low-signal
regression that still explains a third of the variance) stay silent, and the training is bit-identical."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

KIND = "loss_at_chance"


def chance_findings(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


# ---------------------------------------------------------------------------------------------- a regression (MSE)

#: Two output columns of different means and spreads: the mean of their variances (2.5) is far below the variance
#: of all their values (4.75), which a model that learned one mean for both would reach.
TEACHER = torch.randn(8, 2, generator=torch.Generator().manual_seed(5))


def regression_data(signal: float, shuffled: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs and two targets, ``signal`` the share of the targets' variance the inputs explain (the rest noise),
    column 0 of variance 1 around 0, column 1 of variance 4 around 3; the training targets' rows permuted against
    the inputs' (``shuffled``). Training and held-out splits."""
    g = torch.Generator().manual_seed(21)
    x = torch.randn(3000, 8, generator=g)
    clean = x @ TEACHER + 0.3 * torch.sin(2 * x[:, :2])
    clean = (clean - clean.mean(0)) / clean.std(0)
    noise = torch.randn(3000, 2, generator=g)
    z = math.sqrt(signal) * clean + math.sqrt(1 - signal) * noise
    y = z * torch.tensor([1.0, 2.0]) + torch.tensor([0.0, 3.0])
    xt, yt, xv, yv = x[:2400], y[:2400], x[2400:], y[2400:]
    if shuffled:
        yt = yt[torch.randperm(len(yt), generator=torch.Generator().manual_seed(7))]
    return xt, yt, xv, yv


def train_regression(signal: float, shuffled: bool, watched: bool) -> tuple[list[float], NeuralDbg | None, float]:
    """A user's loop: an MLP under Adam, ``F.mse_loss`` on mini-batches, eight epochs. Returns the losses, the
    debugger (when watched) and the held-out R^2 (mean over the columns)."""
    xt, yt, xv, yv = regression_data(signal, shuffled)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []

    def loop() -> None:
        order = torch.Generator().manual_seed(1)
        for _ in range(8):
            perm = torch.randperm(len(xt), generator=order)
            for b in range(0, len(xt), 64):
                idx = perm[b : b + 64]
                opt.zero_grad()
                loss = F.mse_loss(model(xt[idx]), yt[idx])
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))

    dbg = None
    if watched:
        with NeuralDbg(model) as dbg:
            loop()
    else:
        loop()
    with torch.no_grad():
        pred = model(xv)
    r2 = 1 - ((pred - yv) ** 2).mean(0) / yv.var(0, unbiased=False)
    return losses, dbg, float(r2.mean())


def column_variance(signal: float, shuffled: bool) -> float:
    """The mean of the training targets' variances per column (plain torch): the loss of predicting their means."""
    _, yt, _, _ = regression_data(signal, shuffled)
    return float(yt.var(0, unbiased=False).mean())


def test_shuffled_regression_targets_leave_the_error_at_their_variance_and_are_found():
    plain, _, r2 = train_regression(1.0, shuffled=True, watched=False)
    _, _, twin_r2 = train_regression(1.0, shuffled=False, watched=False)
    variance = column_variance(1.0, shuffled=True)
    pooled = float(regression_data(1.0, True)[1].var(unbiased=False))
    # plain torch: nothing learned (R^2 about 0 held out, the twin near 1), the loss at the per-column variance,
    # far below the variance of all the values
    assert abs(r2) < 0.05 and twin_r2 > 0.9
    assert abs(mean(plain[-40:]) - variance) < 0.04 * variance
    assert pooled > 1.5 * variance
    losses, dbg, _ = train_regression(1.0, shuffled=True, watched=True)
    assert losses == plain
    assert dbg is not None
    found = chance_findings(dbg)
    assert found, dbg.report()
    m = found[0].root.metrics
    assert abs(m["target_level"] - variance) < 0.1 * variance  # the first backward passes' targets stand for all
    text = found[0].explanation
    assert "targets' variance" in text and "no better than predicting the mean" in text
    assert "log(" not in text
    assert "(1) targets that do not match the inputs" in text


def test_the_same_regression_with_its_targets_in_place_is_silent():
    plain, _, r2 = train_regression(1.0, shuffled=False, watched=False)
    assert r2 > 0.9
    losses, dbg, _ = train_regression(1.0, shuffled=False, watched=True)
    assert losses == plain
    assert dbg is not None and not chance_findings(dbg), dbg.report()


def test_a_low_signal_regression_that_still_learns_is_silent():
    plain, _, r2 = train_regression(0.3, shuffled=False, watched=False)
    variance = column_variance(0.3, shuffled=False)
    # plain torch: a third of the variance explained, held out; the loss ends clearly below the variance
    assert 0.2 < r2 < 0.4
    assert mean(plain[-40:]) < 0.85 * variance
    losses, dbg, _ = train_regression(0.3, shuffled=False, watched=True)
    assert losses == plain
    assert dbg is not None and not chance_findings(dbg), dbg.report()


# ------------------------------------------------------------------------------ a multi-label classifier (BCE)

#: Five labels of different base rates (0.1 to 0.5): their mean binary entropy is below log 2.
RATES = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])
LABELER = torch.randn(16, 5, generator=torch.Generator().manual_seed(9))


def multilabel_data(shuffled: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs and five 0/1 labels a teacher gives (label k on for the top ``RATES[k]`` share of its score), the
    training labels' rows permuted against the inputs' (``shuffled``). Training and held-out splits."""
    g = torch.Generator().manual_seed(31)
    x = torch.randn(3000, 16, generator=g)
    score = x @ LABELER + 0.3 * torch.randn(3000, 5, generator=g)
    cut = torch.stack([score[:, k].quantile(1 - RATES[k]) for k in range(5)])
    y = (score > cut).float()
    xt, yt, xv, yv = x[:2400], y[:2400], x[2400:], y[2400:]
    if shuffled:
        yt = yt[torch.randperm(len(yt), generator=torch.Generator().manual_seed(7))]
    return xt, yt, xv, yv


def base_rate_entropy(y: torch.Tensor) -> float:
    """The mean binary entropy of the labels' base rates, in nats (plain torch)."""
    p = y.double().mean(0)
    return float(-(p * p.log() + (1 - p) * (1 - p).log()).mean())


def f1(logits: torch.Tensor, y: torch.Tensor) -> float:
    pred = (logits > 0).float()
    tp, fp, fn = (pred * y).sum(), (pred * (1 - y)).sum(), ((1 - pred) * y).sum()
    return float(2 * tp / (2 * tp + fp + fn + 1e-9))


def train_multilabel(shuffled: bool, watched: bool) -> tuple[list[float], NeuralDbg | None, float]:
    """A user's loop: an MLP under SGD with momentum, ``nn.BCEWithLogitsLoss`` on mini-batches, eight epochs.
    Returns the losses, the debugger (when watched) and the held-out micro-F1."""
    xt, yt, xv, yv = multilabel_data(shuffled)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.BCEWithLogitsLoss()
    losses: list[float] = []

    def loop() -> None:
        order = torch.Generator().manual_seed(1)
        for _ in range(8):
            perm = torch.randperm(len(xt), generator=order)
            for b in range(0, len(xt), 64):
                idx = perm[b : b + 64]
                opt.zero_grad()
                loss = criterion(model(xt[idx]), yt[idx])
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))

    dbg = None
    if watched:
        with NeuralDbg(model) as dbg:
            loop()
    else:
        loop()
    with torch.no_grad():
        return losses, dbg, f1(model(xv), yv)


def test_shuffled_multilabel_targets_leave_the_loss_at_the_base_rates_entropy_and_are_found():
    plain, _, score = train_multilabel(shuffled=True, watched=False)
    _, _, twin = train_multilabel(shuffled=False, watched=False)
    level = base_rate_entropy(multilabel_data(True)[1])
    # plain torch: held-out F1 far below the twin's, the loss at the labels' base-rate entropy, below log 2
    assert twin > 0.8 and score < 0.5 * twin
    assert level < 0.9 * math.log(2)
    assert abs(mean(plain[-40:]) - level) < 0.03 * level
    losses, dbg, _ = train_multilabel(shuffled=True, watched=True)
    assert losses == plain
    assert dbg is not None
    found = chance_findings(dbg)
    assert found, dbg.report()
    m = found[0].root.metrics
    assert abs(m["target_level"] - level) < 0.05 * level
    text = found[0].explanation
    assert "binary entropy of the labels' base rates" in text and "log(" not in text
    assert "(1) labels that do not match the inputs" in text


def test_the_same_multilabel_classifier_with_its_labels_in_place_is_silent():
    plain, _, score = train_multilabel(shuffled=False, watched=False)
    assert score > 0.8
    losses, dbg, _ = train_multilabel(shuffled=False, watched=True)
    assert losses == plain
    assert dbg is not None and not chance_findings(dbg), dbg.report()
