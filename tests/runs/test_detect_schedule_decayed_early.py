"""A learning-rate schedule that reaches its floor early and holds the run there is a stall, even after a partial fit;
the tail of a schedule at the run's end is not.

ReduceLROnPlateau stepped on every noisy batch loss (patience 20 batches) instead of once per epoch halves the
learning rate every ~20 steps: 3e-3 is a hundredth of itself by step ~220 of 600 and 1e-8 at the end. The loss had
already fallen to half of where it began, which once read as the tail of a schedule, and the float64 regression
stops at a held-out R^2 of ~0.5 against ~0.99 for its twin stepped per epoch (sweep L, finding 3). The twins that
must stay silent: a cosine to 0 or to 1e-6, a step decay tenfold at 50 % and 75 %, OneCycleLR, a linear warm-up and
decay, ReduceLROnPlateau stepped per epoch reaching its min_lr late, and a fit that converged before the learning
rate fell.

Ground truth by plain torch in each test: the held-out R^2 (against the twin stepped per epoch), the learning rate's
history (where it reached a hundredth of its peak), the losses, and the last steps' update/weight ratios."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import DebugConfig, FailureKind, NeuralDbg

STEPS = 600
EPOCH = 50  # batches per "epoch" of the schedules stepped per epoch
Schedule = Callable[[torch.optim.Optimizer], object]


def smooth(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(2 * x[:, 0]) * torch.cos(3 * x[:, 1]) + x[:, 2] ** 3


def linear(x: torch.Tensor) -> torch.Tensor:
    return x[:, 0] - 0.5 * x[:, 1] + 0.25 * x[:, 2]


def data(n: int, seed: int, target: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, generator=g, dtype=torch.float64) * 2 - 1
    return x, target(x)[:, None]


@dataclass
class Run:
    r2: float = 0.0  # held-out
    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    last_ratios: list[float] = field(default_factory=list)  # median update/weight ratio of the last 20 steps
    dbg: NeuralDbg | None = None

    @property
    def floor(self) -> int | None:
        """The first step whose learning rate is a hundredth of the run's largest or lower."""
        return next((i for i, lr in enumerate(self.lrs) if lr <= 1e-2 * max(self.lrs)), None)

    def loss(self, start: int, end: int) -> float:
        return statistics.fmean(self.losses[start:end])


def train(schedule: Schedule, per: str, watched: bool, target: Callable[[torch.Tensor], torch.Tensor] = smooth) -> Run:
    """A float64 MLP regression under Adam 3e-3; ``per``: the schedule is stepped every "batch" with its loss,
    every "epoch" with the epoch's mean loss, or every "step" without one."""
    torch.manual_seed(0)
    x, y = data(2048, 1, target)
    model = nn.Sequential(nn.Linear(3, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 1)).double()
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    sched = schedule(opt)
    run, epoch_loss = Run(), 0.0
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.__enter__()
    for step in range(STEPS):
        idx = torch.randint(0, 2048, (256,))
        loss = F.mse_loss(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        last = step >= STEPS - 20
        before = [p.detach().clone() for p in model.parameters()] if last else []
        run.lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if last:
            run.last_ratios.append(support.median_update_ratio(model.parameters(), before))
        run.losses.append(loss.item())
        epoch_loss += loss.item()
        if per == "batch":
            sched.step(loss.item())  # type: ignore[attr-defined]
        elif per == "epoch" and step % EPOCH == EPOCH - 1:
            sched.step(epoch_loss / EPOCH)  # type: ignore[attr-defined]
        elif per == "step":
            sched.step()  # type: ignore[attr-defined]
        if step % EPOCH == EPOCH - 1:
            epoch_loss = 0.0
    if dbg is not None:
        dbg.__exit__(None, None, None)
    xt, yt = data(1024, 2, target)
    with torch.no_grad():
        run.r2 = 1 - F.mse_loss(model(xt), yt).item() / yt.var().item()
    run.dbg = dbg
    return run


def plateau(patience: int, **kw: float) -> Schedule:
    return lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=patience, **kw)


def stalled(run: Run) -> bool:
    assert run.dbg is not None
    return FailureKind.STALLED_UPDATES in {e.kind for e in run.dbg.events}


def test_reduce_on_plateau_stepped_every_batch_decayed_early_is_a_stall() -> None:
    per_batch = plateau(20, factor=0.5)
    plain = train(per_batch, "batch", watched=False)
    twin = train(per_batch, "epoch", watched=False)
    # plain torch: the learning rate is a hundredth of its peak before 40 % of the run's steps and ends near
    # 1e-8; the loss had fallen to half of its start by then (what read as a schedule's tail), the last steps move
    # the weights by far less than the stall limit, and the fit stops far short of its twin stepped per epoch
    assert plain.floor is not None and plain.floor < 0.4 * STEPS and plain.lrs[-1] < 1e-7
    assert plain.loss(plain.floor - 8, plain.floor) < 0.75 * plain.loss(0, 8)
    assert max(plain.last_ratios) < 1e-2 * DebugConfig().stalled_ratio
    assert plain.r2 < 0.7 and twin.r2 > 0.98

    watched = train(per_batch, "batch", watched=True)
    assert watched.losses == plain.losses  # the debugger changes nothing
    assert watched.dbg is not None and stalled(watched)
    text = " ".join(watched.dbg.explain_failure())
    assert "decayed too early" in text
    assert "once per epoch with the validation loss" in text and "mode='min' for a loss" in text  # its two slips


def cosine(eta_min: float) -> Schedule:
    return lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS, eta_min=eta_min)


def warm_up_and_decay(opt: torch.optim.Optimizer) -> object:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / 30, (STEPS - s) / (STEPS - 30)))


TAILS = {
    "cosine to 0": (cosine(0.0), "step"),
    "cosine to 1e-6": (cosine(1e-6), "step"),
    "step decay at 50% and 75%": (
        lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, [STEPS // 2, 3 * STEPS // 4], 0.1),
        "step",
    ),
    "one cycle": (lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, 3e-3, total_steps=STEPS), "step"),
    "linear warm-up and decay": (warm_up_and_decay, "step"),
    # cut tenfold whenever an epoch's mean loss fell by less than 40 %: min_lr (1e-4 of the peak) at step 400
    "plateau per epoch to min_lr late": (plateau(0, factor=0.1, threshold=0.4, min_lr=3e-7), "epoch"),
}


@pytest.mark.parametrize("name", TAILS)
def test_the_tail_of_a_schedule_at_the_run_s_end_is_not_a_stall(name: str) -> None:
    schedule, per = TAILS[name]
    run = train(schedule, per, watched=True)
    # plain torch (watched training is bit-identical): the fit is good, and the learning rate reached a hundredth
    # of its peak, if at all, only in the run's last half
    assert run.r2 > 0.95
    assert run.floor is None or run.floor >= STEPS // 2
    assert not stalled(run), run.dbg and run.dbg.explain_failure()
    assert run.dbg is not None and run.dbg.healthy, run.dbg.explain_failure()


def test_a_cosine_tail_stalls_the_last_steps_and_is_still_silent() -> None:
    """The twins above are not silent for want of small updates: a cosine's last steps are under the stall limit."""
    run = train(cosine(0.0), "step", watched=True)
    assert max(run.last_ratios[-5:]) < DebugConfig().stalled_ratio
    assert not stalled(run), run.dbg and run.dbg.explain_failure()


def test_a_fit_that_converged_before_the_learning_rate_fell_is_not_a_stall() -> None:
    """ReduceLROnPlateau stepped every batch with a patience of 5 on a target the model fits exactly: the learning
    rate is a hundredth of its peak by step ~110, but the loss had already fallen a hundredfold: the fit had
    converged, and the small updates after it are the fit's."""
    run = train(plateau(5, factor=0.5), "batch", watched=True, target=linear)
    assert run.floor is not None and run.floor < STEPS // 3
    assert run.loss(run.floor - 8, run.floor) < 1e-2 * run.loss(0, 8)
    assert run.r2 > 0.99
    assert not stalled(run), run.dbg and run.dbg.explain_failure()
    assert run.dbg is not None and run.dbg.healthy, run.dbg.explain_failure()


def test_a_schedule_that_decays_before_the_loss_fell_is_still_a_stall() -> None:
    """The same schedule with a patience of 5 on the harder target: the learning rate is a hundredth of its peak
    by step ~60, and the loss had barely moved."""
    run = train(plateau(5, factor=0.5), "batch", watched=True)
    assert run.floor is not None and run.floor < STEPS // 6
    assert run.loss(STEPS - 8, STEPS) > 0.75 * run.loss(0, 8)
    assert run.r2 < 0.3
    assert stalled(run)
