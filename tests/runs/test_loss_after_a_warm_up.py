"""A learning-rate warm-up that ended early in the run leaves its loss judged; one still under way at the end does
not. The gate compared the last tenth of the run with its first tenth, so a warm-up that filled the first tenth (a
transformer warmed up over its first epoch of ten: hunt 22) kept every loss finding off the whole run. Ground truth
is plain torch: labels drawn at random for each batch hold nothing to learn (the loss stays at log 4), the same
program on labels a linear teacher gives learns."""

from __future__ import annotations

import math

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

STEPS = 320


def train(warm_up: int, random_labels: bool, watched: bool, lr: float = 1e-3) -> tuple[list[float], NeuralDbg | None]:
    """An MLP classifier under Adam 1e-3 whose learning rate rises linearly over ``warm_up`` steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warm_up))
    teacher = torch.randn(20, 4)
    losses: list[float] = []

    def loop() -> None:
        for _ in range(STEPS):
            x = torch.randn(64, 20)
            y = torch.randint(0, 4, (64,)) if random_labels else (x @ teacher).argmax(1)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
            losses.append(loss.item())

    return losses, support.watching(model, loop, watched)


def end(losses: list[float]) -> float:
    return sum(losses[-50:]) / 50 / math.log(4)


def test_labels_at_chance_after_a_warm_up_of_the_first_tenth_are_found():
    plain, _ = train(warm_up=STEPS // 10, random_labels=True, watched=False)
    assert abs(end(plain) - 1) < 0.02  # plain torch: nothing to learn, the loss stays at log 4
    watched, dbg = train(warm_up=STEPS // 10, random_labels=True, watched=True)
    assert watched == plain and dbg is not None
    assert [h.kind.value for h in dbg.hypotheses()][:1] == ["loss_at_chance"], dbg.report()


def test_the_twin_that_learns_after_the_same_warm_up_is_silent():
    plain, _ = train(warm_up=STEPS // 10, random_labels=False, watched=False)
    assert end(plain) < 0.4  # plain torch: it learns the teacher
    watched, dbg = train(warm_up=STEPS // 10, random_labels=False, watched=True)
    assert watched == plain and dbg is not None and dbg.healthy, dbg.explain_failure()


def test_a_warm_up_still_under_way_at_the_end_leaves_the_loss_unjudged():
    """Warmed up over 400 steps, the run of 320 ends before its learning rate (3e-3) peaks: it never trained at it,
    and no loss finding is made, though its updates add up to enough to judge a run at its learning rate."""
    plain, _ = train(warm_up=400, random_labels=True, watched=False, lr=3e-3)
    assert abs(end(plain) - 1) < 0.02
    watched, dbg = train(warm_up=400, random_labels=True, watched=True, lr=3e-3)
    assert watched == plain and dbg is not None and dbg.hypotheses() == [], dbg.report()
