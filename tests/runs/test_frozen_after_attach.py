"""Layers frozen after the debugger was made (``requires_grad_(False)`` in a Lightning ``on_train_start``, a warm-up
of the head, progressive freezing) get no gradient and no update: they are not a stall of the layers that train.
With the step's closure (Lightning's and LBFGS's way) every parameter's update is read, and the frozen layers'
zeros made the median update of a model whose head trained at every step read 0: ``stalled_updates``, "no parameter
changes at all". A head too slow to train beside them still is a stall.

Ground truth by plain torch: the head's weight changes at every step (and by how much), the frozen layers do not,
the loss falls; watched or not, the training is bit-identical."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 100


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def train(head_lr: float, watched: bool) -> tuple[list[float], list[float], bool, NeuralDbg | None]:
    """The backbone frozen inside the watched block, the head trained by Adam through ``step(closure)``. Returns the
    losses, the head weight's largest change at each step, whether the backbone moved, and the debugger."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3200, 16, generator=g)
    y = (x @ torch.randn(16, generator=g) > 0).long()
    model = Net()
    opt = torch.optim.Adam(model.head.parameters(), lr=head_lr)
    backbone = [p.detach().clone() for p in model.backbone.parameters()]
    losses: list[float] = []
    moves: list[float] = []
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.__enter__()
    model.backbone.requires_grad_(False)  # after the debugger attached, as on_train_start does
    for _ in range(STEPS):
        i = torch.randint(0, 3200, (32,), generator=g)

        def closure(i: torch.Tensor = i) -> torch.Tensor:
            opt.zero_grad()
            loss = F.cross_entropy(model(x[i]), y[i])
            loss.backward()
            return loss

        before = model.head.weight.detach().clone()
        losses.append(float(opt.step(closure).detach()))
        moves.append(float((model.head.weight.detach() - before).abs().max()))
    if dbg is not None:
        dbg.__exit__(None, None, None)
    moved = any(not torch.equal(b, p) for b, p in zip(backbone, model.backbone.parameters()))
    return losses, moves, moved, dbg


def stalled(dbg: NeuralDbg | None) -> bool:
    assert dbg is not None
    return FailureKind.STALLED_UPDATES in {e.kind for e in dbg.events}


def test_a_head_trained_beside_layers_frozen_after_attach_is_not_a_stall() -> None:
    losses, moves, moved, _ = train(3e-3, watched=False)
    # plain torch: the head moves at every step, the frozen backbone never, the loss falls
    assert min(moves) > 1e-3 and not moved
    assert sum(losses[-10:]) < 0.9 * sum(losses[:10])

    watched, _, _, dbg = train(3e-3, watched=True)
    assert watched == losses  # the debugger changes nothing
    assert not stalled(dbg), dbg and dbg.explain_failure()
    assert dbg is not None and dbg.healthy, dbg.explain_failure()


def test_a_head_too_slow_to_train_beside_them_is_still_a_stall() -> None:
    losses, moves, moved, dbg = train(1e-9, watched=True)
    # plain torch: the head moves by a billionth at most, the loss stays where it began
    assert max(moves) < 1e-8 and not moved
    assert abs(sum(losses[-10:]) - sum(losses[:10])) < 0.05 * sum(losses[:10])
    assert stalled(dbg)
