"""Stalled updates judged against the run's own history when the debugger attaches mid-training (a resumed run, a
fine-tuning script): an ill-conditioned regression under SGD with momentum, trained 3,000 steps at lr 3e-4 and then
at 3e-5, has tiny updates (median ||dW||/||W|| about 5e-6) while its loss still falls; watched from step 0 the same
steps are healthy (its gradients fell a hundredfold from the first), so attached at step 3,000 they must be too. A
schedule that decays to nothing while watched is still a stall.

Ground truth by plain torch: the loss over the watched steps, and the update ratio per step from parameter copies."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

BEFORE, WATCHED = 3000, 1000
SCALES = torch.logspace(0, -2.5, 32)  # feature scales over 2.5 decades: the loss keeps falling slowly


def run(attach_at: int, decay: float = 1.0) -> tuple[NeuralDbg, list[float], list[float]]:
    """Train BEFORE + WATCHED steps, watched from ``attach_at``; after BEFORE steps the learning rate drops to 3e-5
    and is multiplied by ``decay`` at every step. Returns the debugger, the watched losses and update ratios."""
    torch.manual_seed(0)
    teacher = torch.randn(32, 1)
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=3e-4, momentum=0.9)
    dbg = NeuralDbg(model)
    losses: list[float] = []
    ratios: list[float] = []
    for step in range(BEFORE + WATCHED):
        if step == attach_at:
            dbg.__enter__()
        if step >= BEFORE:
            for group in opt.param_groups:
                group["lr"] = 3e-5 if step == BEFORE else group["lr"] * decay
        x = torch.randn(64, 32, generator=torch.Generator().manual_seed(step)) * SCALES
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        loss = F.mse_loss(model(x), x @ teacher)
        loss.backward()
        opt.step()
        if step >= BEFORE:
            losses.append(loss.item())
            ratios.append(support.median_update_ratio(model.parameters(), before))
    dbg.__exit__(None, None, None)
    return dbg, losses, ratios


def stalled(dbg: NeuralDbg) -> bool:
    return FailureKind.STALLED_UPDATES in {h.kind for h in dbg.hypotheses()}


def test_a_run_attached_mid_training_whose_loss_still_falls_is_not_stalled() -> None:
    late, losses, ratios = run(attach_at=BEFORE)
    whole, whole_losses, _ = run(attach_at=0)

    # plain torch: tiny updates, a loss that still falls, and the same run either way
    assert statistics.median(ratios) < 1e-5
    assert statistics.fmean(losses[-200:]) < 0.97 * statistics.fmean(losses[:200])
    assert losses == whole_losses
    assert not stalled(whole)  # watched from step 0: healthy
    assert not stalled(late)


def test_a_schedule_that_decays_to_nothing_while_watched_is_stalled_even_when_attached_late() -> None:
    dbg, losses, ratios = run(attach_at=BEFORE, decay=0.99)

    # plain torch: the updates fall a thousandfold while watched and the loss stops falling
    assert statistics.fmean(ratios[-100:]) < 1e-3 * statistics.fmean(ratios[:10])
    assert abs(statistics.fmean(losses[-100:]) / statistics.fmean(losses[-300:-200]) - 1) < 0.01
    assert stalled(dbg)


def _teacher(n: int = 3000) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 20, generator=g)
    w1, w2 = torch.randn(20, 32, generator=g), torch.randn(32, 8, generator=g)
    return x, (torch.tanh(x @ w1 / 4) @ w2).argmax(1)


def _continue(
    model: nn.Module,
    data: tuple[torch.Tensor, torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    measure: Callable[[torch.Tensor, torch.Tensor], float],
    trained: int,
    lr: float,
    seed: int,
    watched: bool,
) -> tuple[float, float, list[float], NeuralDbg | None]:
    """``model`` trained ``trained`` steps on the first 2,000 rows of ``data`` (Adam 1e-3, not watched), then
    continued 250 steps by a new Adam at ``lr``. Returns ``measure(output, target)`` on the rows after 2,000 before
    and after the continued run, its losses and the debugger."""
    x, y = data
    first, draw = torch.optim.Adam(model.parameters(), 1e-3), torch.Generator().manual_seed(5)
    for _ in range(trained):
        idx = torch.randint(0, 2000, (64,), generator=draw)
        first.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        first.step()

    def held_out() -> float:
        with torch.no_grad():
            return measure(model(x[2000:]), y[2000:])

    before = held_out()
    opt, order = torch.optim.Adam(model.parameters(), lr), torch.Generator().manual_seed(seed + 100)
    losses: list[float] = []

    def loop() -> None:
        for _ in range(250):
            idx = torch.randint(0, 2000, (64,), generator=order)
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())

    dbg = support.watching(model, loop, watched)
    return before, held_out(), losses, dbg


def _continued(lr: float, seed: int, watched: bool) -> tuple[float, float, list[float], NeuralDbg | None]:
    """An 8-class MLP trained 600 steps, continued at ``lr`` (:func:`_continue`): its held-out accuracy before and
    after, its losses and the debugger."""
    data = _teacher()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 8))

    def accuracy(out: torch.Tensor, target: torch.Tensor) -> float:
        return float((out.argmax(1) == target).float().mean())

    return _continue(model, data, F.cross_entropy, accuracy, 600, lr, seed, watched)


def test_a_trained_classifier_continued_by_a_new_optimizer_at_a_small_learning_rate_is_not_a_run_too_small():
    """Hunt 11: its small steps (5e-5; they add up to a few percent of the weights) are the fine-tuning's. Plain
    torch over three seeds: the held-out accuracy holds where it was before (0.80), as at twice the learning rate;
    its first losses are far below chance (log 8). It was told the run was too small to train and to raise the
    learning rate."""
    for seed in range(3):
        before, after, losses, _ = _continued(5e-5, seed, watched=False)
        _, twice, _, _ = _continued(1e-4, seed, watched=False)
        assert after >= before - 0.02 and after >= twice - 0.02
        assert statistics.fmean(losses[:8]) < 0.3 * math.log(8)
    _, _, plain, _ = _continued(5e-5, 0, watched=False)
    _, _, losses, dbg = _continued(5e-5, 0, watched=True)
    assert losses == plain and dbg is not None
    assert dbg.hypotheses() == [], dbg.explain_failure()


def _regression_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 16, generator=g)
    y = (torch.sin(x[:, :4] * 2).sum(1) + x[:, 4] * x[:, 5])[:, None] + 0.3 * torch.randn(3000, 1, generator=g)
    return x, y


def _continued_regression(lr: float, seed: int, watched: bool) -> tuple[float, float, list[float], NeuralDbg | None]:
    """A regression MLP trained 1,500 steps, continued at ``lr`` (:func:`_continue`): its held-out MSE before and
    after, its losses and the debugger."""
    data = _regression_data()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1))
    return _continue(model, data, F.mse_loss, lambda out, y: F.mse_loss(out, y).item(), 1500, lr, seed, watched)


def test_a_fitted_regression_continued_by_a_new_optimizer_at_a_small_learning_rate_is_not_a_run_too_small():
    """Hunt 11's continue_reg: the regression's first losses are far under its targets' variance (met already
    fitted). Plain torch over three seeds: the held-out MSE holds where it was, as at twice the learning rate."""
    for seed in range(3):
        before, after, losses, _ = _continued_regression(5e-5, seed, watched=False)
        _, twice, _, _ = _continued_regression(1e-4, seed, watched=False)
        assert after <= before * 1.05 and after <= twice * 1.05
    assert statistics.fmean(losses[:8]) < 0.3 * float(_regression_data()[1].var())  # far below the targets' variance
    _, _, plain, _ = _continued_regression(5e-5, 0, watched=False)
    _, _, watched, dbg = _continued_regression(5e-5, 0, watched=True)
    assert watched == plain and dbg is not None
    assert dbg.hypotheses() == [], dbg.explain_failure()
