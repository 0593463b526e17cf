"""Stalled updates judged against the run's own history when the debugger attaches mid-training (a resumed run, a
fine-tuning script): an ill-conditioned regression under SGD with momentum, trained 3,000 steps at lr 3e-4 and then
at 3e-5, has tiny updates (median ||dW||/||W|| about 5e-6) while its loss still falls; watched from step 0 the same
steps are healthy (its gradients fell a hundredfold from the first), so attached at step 3,000 they must be too. A
schedule that decays to nothing while watched is still a stall.

Ground truth by plain torch: the loss over the watched steps, and the update ratio per step from parameter copies."""

from __future__ import annotations

import statistics

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
            ratios.append(
                statistics.median(float((p.detach() - b).norm() / b.norm()) for p, b in zip(model.parameters(), before))
            )
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
