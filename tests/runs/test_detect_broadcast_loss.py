"""A loss broadcast across samples: a prediction of shape (N, 1) against a target of (N,) compares every prediction
with every target, and the model learns their mean. Ground truth is plain torch in each test: the same regression
with matching shapes fits (R^2 near 1) while the broadcast one does not (R^2 near 0, the loss at the targets'
variance). The healthy twins, whose broadcasts pair each sample with its own targets, stay silent."""

from __future__ import annotations

import warnings

import support
import torch
import torch.nn.functional as F
from torch import nn

KIND = "broadcast_loss"
STEPS = 80


def batches(step: int, targets: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A smooth regression of 8 features: targets of shape (N,), or (N, targets) noisy copies of it."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(64, 8, generator=g)
    y = torch.sin(x[:, 0]) + 0.5 * x[:, 1]
    if targets:
        return x, y[:, None] + 0.05 * torch.randn(64, targets, generator=g)
    return x, y


def regressor(outputs: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, outputs))


def r2(model: nn.Module) -> float:
    x, y = batches(10_000)
    with torch.no_grad():
        pred = model(x).reshape(-1)
    return float(1 - ((pred - y) ** 2).mean() / y.var())


def train(loss_fn, watched: bool, make=batches, outputs: int = 1):
    torch.manual_seed(0)
    model = regressor(outputs)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own size warning, the one users miss
        losses, dbg = support.fit(model, make, loss_fn, STEPS, opt, watched)
    return model, losses, dbg


def kinds(dbg) -> list[str]:
    return [h.kind.value for h in dbg.hypotheses()]


def matched(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(pred.squeeze(1), y)


def by_hand(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((pred - y) ** 2).mean()


def test_mse_loss_of_a_column_against_a_vector_is_found_and_its_fixed_twin_is_silent():
    broadcast, losses, _ = train(F.mse_loss, watched=False)
    fixed, _, _ = train(matched, watched=False)
    # plain torch: the broadcast fit predicts the mean; the fixed one fits
    assert r2(broadcast) < 0.2 and r2(fixed) > 0.8
    _, y = batches(0)
    assert abs(sum(losses[-10:]) / 10 - float(y.var())) < 0.25 * float(y.var())

    _, watched, dbg = train(F.mse_loss, watched=True)
    assert watched == losses  # the debugger changes nothing
    assert kinds(dbg)[:1] == [KIND], dbg.explain_failure()
    found = dbg.hypotheses()[0]
    assert "mse_loss was given a prediction of shape (64, 1) (the output of '4')" in found.explanation
    assert "broadcast against it to (64, 64), from step 0" in found.explanation
    assert "out.squeeze(1)" in found.suggestion

    _, _, twin = train(matched, watched=True)
    assert twin.healthy, twin.explain_failure()


def test_a_difference_taken_by_hand_is_found_too():
    model, _, _ = train(by_hand, watched=False)
    assert r2(model) < 0.2  # plain torch: the same harm, without torch's warning
    _, _, dbg = train(by_hand, watched=True)
    assert kinds(dbg)[:1] == [KIND], dbg.explain_failure()
    assert "a difference taken by hand took a prediction of shape (64, 1)" in dbg.hypotheses()[0].explanation


def test_broadcasts_that_pair_each_sample_with_its_own_targets_are_silent():
    def measurements(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return batches(step, targets=3)

    # one prediction per sample against its 3 noisy measurements: (64, 1) against (64, 3), by torch and by hand
    for loss_fn in (F.mse_loss, by_hand):
        model, _, _ = train(loss_fn, watched=False, make=measurements)
        assert r2(model) > 0.8  # plain torch: it fits
        _, _, dbg = train(loss_fn, watched=True, make=measurements)
        assert KIND not in kinds(dbg), dbg.explain_failure()

    # every sample's (N, 8) output against one target vector shared by all: (64, 8) against (8,)
    def shared(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, _ = batches(step)
        return x, torch.linspace(-1, 1, 8)

    _, _, dbg = train(F.mse_loss, watched=True, make=shared, outputs=8)
    assert KIND not in kinds(dbg), dbg.explain_failure()


def test_the_shapes_that_pair_samples():
    from neuraldbg.capture.loss_graph import _pairs_samples

    assert _pairs_samples((32, 1), (32, 32))
    assert _pairs_samples((32,), (32, 32))
    assert _pairs_samples((32, 1, 56), (32, 32, 56))
    assert not _pairs_samples((1, 8), (32, 8))  # one prediction for every sample
    assert not _pairs_samples((32, 1), (32, 3))  # each sample against its own 3 targets
    assert not _pairs_samples((32, 8), (32, 8))
    assert not _pairs_samples((1,), (32,))
