"""The tail of a learning-rate schedule is not a stall: a classifier under SGD with momentum and a
CosineAnnealingLR that ends near 0, trained with label smoothing (its loss cannot fall near 0, so the fit never
reads as converged), makes updates of ~1e-7 of the weights over its last steps. The schedule brought the learning
rate down from the one the run trained with, after the loss fell: that is the schedule, not a learning rate too
low. A learning rate too low from the start, and a schedule that decays before the loss fell, are still stalls.

Ground truth by plain torch in each test: the held-out accuracy of the smoothed run against its twin without
smoothing (no worse), the update/weight ratio of its last steps (below the stall limit), the losses; and watched
or not, the training is bit-identical."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import DebugConfig, FailureKind, NeuralDbg

STEPS = 150
CLASSES = 4
make = support.classification_batches((16,), CLASSES, batch=64, seed=3)


class Run:
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.ratios: list[float] = []  # the median over the parameters of ||dW|| / ||W||, each step
        self.lrs: list[float] = []
        self.accuracy = math.nan
        self.dbg: NeuralDbg | None = None


def train(
    lr: float,
    smoothing: float,
    schedule: Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler] | None,
    watched: bool,
) -> Run:
    """An MLP classifier under SGD with momentum; ``schedule`` stepped every batch, as the user's loop does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    sched = schedule(opt) if schedule is not None else None
    run = Run()
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.__enter__()
    for step in range(STEPS):
        x, y = make(step)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y, label_smoothing=smoothing)
        loss.backward()
        before = [p.detach().clone() for p in model.parameters()]
        run.lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched is not None:
            sched.step()
        run.ratios.append(support.median_update_ratio(model.parameters(), before))
        run.losses.append(loss.item())
    if dbg is not None:
        dbg.__exit__(None, None, None)
    x, y = make(10_000)  # a held-out batch
    with torch.no_grad():
        run.accuracy = float((model(x).argmax(1) == y).float().mean())
    run.dbg = dbg
    return run


def cosine(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)


def stalled(run: Run) -> bool:
    assert run.dbg is not None
    return FailureKind.STALLED_UPDATES in {e.kind for e in run.dbg.events}


def test_the_end_of_a_cosine_schedule_under_label_smoothing_is_not_a_stall() -> None:
    smoothed, twin = train(0.05, 0.1, cosine, watched=False), train(0.05, 0.0, cosine, watched=False)
    limit = DebugConfig().stalled_ratio
    # plain torch: the smoothed run learns as well as its twin; its loss fell but stays far from 0 (the entropy of
    # the smoothed target is its floor); its last steps move the weights by less than the stall limit, at a
    # learning rate the schedule brought down from 0.05
    assert smoothed.accuracy >= twin.accuracy - 0.02
    assert statistics.fmean(smoothed.losses[-10:]) < 0.5 * statistics.fmean(smoothed.losses[:10])
    assert statistics.fmean(smoothed.losses[-10:]) > 0.3
    assert max(smoothed.ratios[-3:]) < limit and smoothed.lrs[-1] < 1e-3 * smoothed.lrs[0]
    assert statistics.median(smoothed.ratios[: STEPS // 2]) > 100 * limit

    watched = train(0.05, 0.1, cosine, watched=True)
    assert watched.losses == smoothed.losses  # the debugger changes nothing
    assert not stalled(watched), watched.dbg and watched.dbg.explain_failure()
    assert watched.dbg is not None and watched.dbg.healthy, watched.dbg.explain_failure()


def test_a_learning_rate_too_low_from_the_start_is_still_a_stall() -> None:
    low = train(1e-6, 0.1, None, watched=True)
    sound = train(0.05, 0.1, None, watched=False)
    # plain torch: updates below the stall limit from the first step and a loss that stays where it began
    assert max(low.ratios) < DebugConfig().stalled_ratio
    assert statistics.fmean(low.losses[-10:]) > 0.95 * statistics.fmean(low.losses[:10])
    assert statistics.fmean(sound.losses[-10:]) < 0.6 * statistics.fmean(sound.losses[:10])
    assert stalled(low)


def test_a_schedule_that_decays_before_the_loss_fell_is_still_a_stall() -> None:
    def exponential(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        return torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.7)  # meant per epoch, stepped per batch

    early = train(0.05, 0.1, exponential, watched=True)
    # plain torch: the learning rate is 1e-4 of where it began within 26 steps, the updates fall below the stall
    # limit, the loss has barely moved and the model is far from its twin under the cosine schedule
    assert early.lrs[26] < 1e-4 * early.lrs[0]
    assert max(early.ratios[60:]) < DebugConfig().stalled_ratio
    assert statistics.fmean(early.losses[-10:]) > 0.95 * statistics.fmean(early.losses[:10])
    assert early.accuracy < train(0.05, 0.1, cosine, watched=False).accuracy - 0.3
    assert stalled(early)


def test_the_end_of_a_one_cycle_schedule_on_a_hard_task_is_not_a_stall() -> None:
    """Adam under OneCycleLR, which ends at a 25e4th of its peak, on labels that are 60 % noise: the model learns
    what can be learned, but its loss falls only a little (the noise is its floor), so only the distance the
    weights travelled says that the run trained before the schedule brought its updates under the stall limit."""
    make_clean = support.classification_batches((16,), CLASSES, batch=64, seed=5)

    def noisy(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = make_clean(step)
        g = torch.Generator().manual_seed(77_000 + step)
        flip = torch.rand(len(y), generator=g) < 0.6
        return x, torch.where(flip, torch.randint(0, CLASSES, y.shape, generator=g), y)

    def run(watched: bool) -> tuple[list[float], list[float], float, NeuralDbg | None]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=STEPS)
        losses, ratios = [], []
        dbg = NeuralDbg(model) if watched else None
        if dbg is not None:
            dbg.__enter__()
        for step in range(STEPS):
            x, y = noisy(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            before = [p.detach().clone() for p in model.parameters()]
            opt.step()
            sched.step()
            ratios.append(support.median_update_ratio(model.parameters(), before))
            losses.append(loss.item())
        if dbg is not None:
            dbg.__exit__(None, None, None)
        x, y = make_clean(10_000)
        with torch.no_grad():
            accuracy = float((model(x).argmax(1) == y).float().mean())
        return losses, ratios, accuracy, dbg

    losses, ratios, accuracy, _ = run(watched=False)
    # plain torch: it learned (clean held-out accuracy far above the 0.25 of a guess), its loss fell by less than a
    # quarter, and its last steps moved the weights by less than the stall limit
    assert accuracy > 0.6
    assert statistics.fmean(losses[-8:]) > 0.75 * statistics.fmean(losses[:8])
    assert max(ratios[-2:]) < DebugConfig().stalled_ratio
    assert sum(ratios) > 0.05  # more than a run too small to train moves its weights

    watched, _, _, dbg = run(watched=True)
    assert watched == losses  # the debugger changes nothing
    assert dbg is not None and dbg.healthy, dbg.explain_failure()


# ------------------------------------------------------------------------- parameter groups stepped at their own rates


def train_in_groups(
    backbone_lr: Callable[[int], float], watched: bool, smoothing: float = 0.1, head_lr: float = 0.05
) -> tuple[Run, list[list[float]]]:
    """The MLP classifier with its two hidden Linear layers (the backbone) in one group, stepped at
    ``backbone_lr(step)``, and its head in a group of its own at a fixed ``head_lr`` (SimSiam's predictor, a linear
    probe).
    Also each layer's ||dW|| / ||W|| per step (its weight), in the order backbone, backbone, head."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    backbone = [*model[0].parameters(), *model[2].parameters()]
    opt = torch.optim.SGD(
        [{"params": backbone}, {"params": model[4].parameters(), "lr": head_lr}], lr=0.05, momentum=0.9
    )
    weights = [model[0].weight, model[2].weight, model[4].weight]
    run, layers = Run(), []
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.__enter__()
    for step in range(STEPS):
        opt.param_groups[0]["lr"] = backbone_lr(step)
        x, y = make(step)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y, label_smoothing=smoothing)
        loss.backward()
        before = [w.detach().clone() for w in weights]
        opt.step()
        layers.append([float((w.detach() - b).norm() / b.norm()) for w, b in zip(weights, before)])
        run.losses.append(loss.item())
    if dbg is not None:
        dbg.__exit__(None, None, None)
    run.dbg = dbg
    return run, layers


def cosine_to_zero(step: int) -> float:
    return 0.05 * 0.5 * (1 + math.cos(math.pi * step / STEPS))  # 1e-6 at the last step


def test_a_backbone_whose_schedule_decayed_beside_a_head_at_a_fixed_rate_is_not_a_stall() -> None:
    """The largest learning rate of the step is the head's, which never decays: the median layer's (a backbone
    layer's) is the one the schedule brought down."""
    plain, layers = train_in_groups(cosine_to_zero, watched=False)
    limit = DebugConfig().stalled_ratio
    # plain torch: the loss fell; over the last steps both backbone layers (the median of the three) move by less
    # than the stall limit, the head by far more, and the backbone moved well above it earlier
    assert statistics.fmean(plain.losses[-10:]) < 0.5 * statistics.fmean(plain.losses[:10])
    assert all(max(step[:2]) < limit < step[2] for step in layers[-3:])
    assert statistics.median(step[0] for step in layers[: STEPS // 2]) > 100 * limit

    watched, _ = train_in_groups(cosine_to_zero, watched=True)
    assert watched.losses == plain.losses  # the debugger changes nothing
    assert not stalled(watched), watched.dbg and watched.dbg.explain_failure()
    assert watched.dbg is not None and watched.dbg.healthy, watched.dbg.explain_failure()


def test_a_backbone_group_too_low_from_the_start_beside_a_trained_head_is_still_a_stall() -> None:
    """The backbone's learning rate is far below the head's from the first step: not a schedule's tail (it was
    never higher), although the head's training makes the loss fall."""
    plain, layers = train_in_groups(lambda step: 1e-7, watched=False, smoothing=0.0, head_lr=0.2)
    limit = DebugConfig().stalled_ratio
    # plain torch: both backbone layers move by less than the stall limit at every step, the head far more, and the
    # loss fell by more than a quarter (what a schedule's tail needs besides a decayed learning rate)
    assert all(max(step[:2]) < limit < step[2] for step in layers)
    assert statistics.fmean(plain.losses[-8:]) < 0.6 * statistics.fmean(plain.losses[:8])
    watched, _ = train_in_groups(lambda step: 1e-7, watched=True, smoothing=0.0, head_lr=0.2)
    assert watched.losses == plain.losses
    assert watched.dbg is not None
    ends = [e.step_end for e in watched.dbg.events if e.kind is FailureKind.STALLED_UPDATES]
    assert ends and max(ends) >= STEPS - 10  # to the run's end: the loss that fell is the head's doing
