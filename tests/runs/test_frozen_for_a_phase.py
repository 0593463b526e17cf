"""Parameters held at learning rate 0 for a phase of the run are not frozen parameters once a schedule raises it:
linear probing then fine-tuning (LP-FT), the backbone's parameter group at factor 0 of a LambdaLR for the first
steps and 1 after. Ground truth by plain torch: the backbone does not move during the probe and moves after, and
the fine-tuned model beats the probe. The same group at 0 to the end is still frozen (its fix: a non-zero learning
rate, or requires_grad=False)."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 160
PROBE = 80
make = support.classification_batches((16,), 4, batch=64, seed=6)


def run(raised: bool, watched: bool) -> tuple[list[float], list[float], NeuralDbg | None]:
    """The losses, and how far the backbone's first weight moved at each step."""
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    model = nn.Sequential(backbone, nn.Linear(64, 4))
    opt = torch.optim.Adam([{"params": backbone.parameters()}, {"params": model[1].parameters()}], lr=3e-3)
    factor = (lambda step: 0.0 if step < PROBE else 1.0) if raised else (lambda step: 0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [factor, lambda step: 1.0])
    losses, moved = [], []
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.__enter__()
    for step in range(STEPS):
        x, y = make(step)
        before = backbone[0].weight.detach().clone()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        moved.append(float((backbone[0].weight.detach() - before).norm()))
        losses.append(loss.item())
    if dbg is not None:
        dbg.__exit__(None, None, None)
    return losses, moved, dbg


def frozen(dbg: NeuralDbg | None) -> bool:
    assert dbg is not None
    return FailureKind.FROZEN_PARAMETERS in {h.kind for h in dbg.hypotheses()}


def test_a_backbone_held_at_learning_rate_0_while_probing_is_not_frozen_once_fine_tuned():
    losses, moved, _ = run(raised=True, watched=False)
    # plain torch: the backbone does not move while probing, moves once fine-tuning starts, and the fine-tuned
    # model's loss ends below the probe-only model's
    assert max(moved[:PROBE]) == 0.0 and min(moved[PROBE + 1 :]) > 0.0
    assert sum(losses[-10:]) < sum(run(raised=False, watched=False)[0][-10:])
    watched, _, dbg = run(raised=True, watched=True)
    assert watched == losses  # the debugger changes nothing
    assert dbg is not None and not frozen(dbg), dbg.explain_failure()
    assert dbg.healthy, dbg.explain_failure()


def test_a_group_at_learning_rate_0_to_the_end_is_still_frozen():
    _, moved, dbg = run(raised=False, watched=True)
    assert max(moved) == 0.0  # plain torch: never moved
    assert frozen(dbg)
