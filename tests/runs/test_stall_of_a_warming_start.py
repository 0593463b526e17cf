"""A stall of a run's first steps that ends on its own, while a warm-up still raises the learning rate or while the
optimizer starts up, is the schedule's design, not a fault. RAdam's first five steps, before its variance estimate
can be rectified, are SGD-with-momentum steps of ``lr`` times the averaged gradient: under ``clip_grad_norm_`` and a
linear warm-up that starts at a thirtieth of the peak, they move the weights by ~5e-6 of their norm, then RAdam's
adapted steps move them by ~4e-5 and more. Trained one sample a step, the loss is too noisy to read as having
fallen, so only the updates and the learning rates say that the stall passed. A warm-up that never ends, and a peak
too low, still stall.

Ground truth by plain torch in each test: the per-step median update/weight ratio, the held-out accuracy against
the twins without the warm-up or without the clipping, the learning rate the run reaches; and watched or not, the
training is bit-identical."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import DebugConfig, FailureKind, NeuralDbg

STEPS = 120
CLASSES = 3
CHANCE = 1 / CLASSES
LR = 3e-3


class Block(nn.Module):
    """A pre-norm residual MLP block."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(1, width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.mish(self.fc1(self.norm(x))))


def warmup(steps: int) -> Callable[[int], float]:
    """A linear warm-up over ``steps`` scheduler steps, then the peak."""
    return lambda k: min(1.0, (k + 1) / steps)


def constant(k: int) -> float:
    return 1.0


class Run:
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.ratios: list[float] = []  # the median over the parameters of ||dW|| / ||W||, each step
        self.lrs: list[float] = []
        self.accuracy = 0.0
        self.dbg: NeuralDbg | None = None


def train(schedule: Callable[[int], float], clip: float | None = 0.5, lr: float = LR, watched: bool = False) -> Run:
    """A residual MLP on Gaussian blobs (two per class), RAdam, one sample a step, ``schedule`` stepped every step."""
    torch.manual_seed(5)
    g = torch.Generator().manual_seed(5)
    centres = torch.randn(2 * CLASSES, 16, generator=g) * 1.2

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        c = torch.randint(0, 2 * CLASSES, (n,), generator=g)
        return centres[c] + torch.randn(n, 16, generator=g), c % CLASSES

    x, y = draw(3000)
    test_x, test_y = draw(1000)
    model = nn.Sequential(nn.Linear(16, 8), *[Block(8) for _ in range(4)], nn.Linear(8, CLASSES))
    opt = torch.optim.RAdam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    run = Run()
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.__enter__()
    for _ in range(STEPS):
        i = torch.randint(0, len(x), (1,), generator=g)
        opt.zero_grad()
        loss = F.cross_entropy(model(x[i]), y[i])
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        before = [p.detach().clone() for p in model.parameters()]
        run.lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        run.ratios.append(support.median_update_ratio(model.parameters(), before))
        run.losses.append(loss.item())
    if dbg is not None:
        dbg.__exit__(None, None, None)
    model.eval()
    with torch.no_grad():
        run.accuracy = float((model(test_x).argmax(1) == test_y).float().mean())
    run.dbg = dbg
    return run


def stalled(run: Run) -> bool:
    assert run.dbg is not None
    return FailureKind.STALLED_UPDATES in {h.kind for h in run.dbg.hypotheses()}


LIMIT = DebugConfig().stalled_ratio


def test_radams_first_steps_under_a_warmup_and_clipping_are_not_a_stall() -> None:
    warmed = train(warmup(30))
    unwarmed, unclipped = train(constant), train(warmup(30), clip=None)
    # plain torch: RAdam's five un-rectified steps, at a thirtieth of the peak and clipped, move the weights by less
    # than the stall limit; its adapted steps then move them by more, within the warm-up; the run learns as well as
    # its twins without the warm-up or without the clipping
    assert max(warmed.ratios[:5]) < LIMIT < min(warmed.ratios[5:30]) / 2
    assert warmed.lrs[4] < 0.2 * LR and warmed.lrs[-1] == LR
    assert warmed.accuracy > CHANCE + 0.3
    assert warmed.accuracy >= max(unwarmed.accuracy, unclipped.accuracy) - 0.02

    watched = train(warmup(30), watched=True)
    assert watched.losses == warmed.losses  # the debugger changes nothing
    assert not stalled(watched), watched.dbg and watched.dbg.explain_failure()
    assert watched.dbg is not None and watched.dbg.healthy, watched.dbg.explain_failure()


def test_radams_start_up_under_a_tight_clipping_is_not_a_stall() -> None:
    """No warm-up: RAdam's own start-up, its un-rectified steps made small by clipping to 0.05, ends by itself."""
    tight, loose = train(constant, clip=0.05), train(constant)
    # plain torch: the start-up steps fall under the stall limit, the adapted ones are far above it at the same
    # learning rate, and the run learns as well as with the usual clipping
    assert max(tight.ratios[2:5]) < LIMIT and min(tight.ratios[5:]) > 10 * LIMIT
    assert tight.accuracy > CHANCE + 0.3 and tight.accuracy >= loose.accuracy - 0.02

    watched = train(constant, clip=0.05, watched=True)
    assert watched.losses == tight.losses
    assert not stalled(watched), watched.dbg and watched.dbg.explain_failure()


@pytest.mark.parametrize(
    "schedule, lr",
    [
        (warmup(300), LR),  # a warm-up that never ends: the stall ends, the learning rate never reaches its peak
        (warmup(30_000), LR),  # ... nor the stall
        (warmup(30), 3e-5),  # a warm-up that ends at a peak too low: the stall lasts
    ],
    ids=["warmup-never-ends", "warmup-never-ends-stall-lasts", "peak-too-low"],
)
def test_a_warmup_that_never_ends_or_a_peak_too_low_is_still_a_stall(schedule, lr) -> None:
    faulty = train(schedule, lr=lr, watched=True)
    sound = train(warmup(30))
    # plain torch: the first steps move the weights by less than the stall limit, the learning rate ends below the
    # intended peak of 3e-3, and the run learns far less than the warm-up that ends at it
    assert max(faulty.ratios[:8]) < LIMIT
    assert faulty.lrs[-1] < 0.5 * LR
    assert faulty.accuracy < sound.accuracy - 0.1
    assert stalled(faulty), faulty.dbg and faulty.dbg.report()
