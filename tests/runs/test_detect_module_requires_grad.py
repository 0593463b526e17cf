"""``requires_grad`` set on a module instead of its parameters (``module_requires_grad``): the attribute is a plain one
on the ``nn.Module`` and its parameters keep their flag. Ground truth is plain torch in each test: a gradual
unfreezing written ``block.requires_grad = True`` leaves the backbone frozen (its weights never move, held-out
accuracy below the twin written ``block.requires_grad_(True)``); a backbone "frozen" by ``encoder.requires_grad =
False`` keeps training. Silent twins: the same with ``requires_grad_``, and an attribute set beside the parameters'
own flags (it agrees with them)."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

KIND = "module_requires_grad"
g = torch.Generator().manual_seed(1234)
W1, W2 = torch.randn(20, 64, generator=g) / 20**0.5, torch.randn(64, 5, generator=g) / 8


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(64, 20, generator=torch.Generator().manual_seed(step))
    return x, (torch.tanh(x @ W1 * 2) @ W2).argmax(1)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(20 if i == 0 else 64, 64), nn.ReLU()) for i in range(3))
        self.head = nn.Linear(64, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def unfreeze(how: str, watched: bool) -> tuple[float, float, NeuralDbg | None]:
    """The backbone frozen, then one block unfrozen every 50 steps from the top (all groups in the optimizer from the
    start); ``how``: "attribute" (the fault), "method" (``requires_grad_``) or "both" (the attribute set beside the
    method). Returns how far the first block's weights moved, the held-out accuracy and the debugger."""
    torch.manual_seed(0)
    net = Net()
    for p in net.blocks.parameters():
        p.requires_grad = False
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    start = net.blocks[0][0].weight.detach().clone()

    def loop() -> None:
        for step in range(200):
            if step and step % 50 == 0:
                block = net.blocks[3 - step // 50]
                if how in ("method", "both"):
                    block.requires_grad_(True)
                if how in ("attribute", "both"):
                    block.requires_grad = True
            x, y = batch(step)
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()

    dbg = support.watching(net, loop, watched)
    x, y = batch(10_000)
    with torch.no_grad():
        accuracy = float((net(x).argmax(1) == y).float().mean())
    return float((net.blocks[0][0].weight.detach() - start).norm()), accuracy, dbg


def found(dbg: NeuralDbg | None) -> list:
    assert dbg is not None
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_an_unfreezing_that_sets_the_modules_attribute_is_found_and_its_twins_are_silent():
    moved, accuracy, _ = unfreeze("attribute", watched=False)
    fixed_moved, fixed_accuracy, _ = unfreeze("method", watched=False)
    assert moved == 0.0 and fixed_moved > 0.05  # plain torch: the backbone never unfroze
    assert accuracy < fixed_accuracy, (accuracy, fixed_accuracy)

    _, _, dbg = unfreeze("attribute", watched=True)
    hits = found(dbg)
    assert hits, dbg.explain_failure() if dbg else ""
    root = hits[0].root
    assert root.detail == "blocks.2, blocks.1, blocks.0" and root.metrics["value"] == 1.0
    assert root.metrics["trainable"] == 0 and root.metrics["params"] == 2
    assert "nothing was unfrozen" in hits[0].explanation and "requires_grad_(True)" in hits[0].suggestion
    for how in ("method", "both"):
        _, _, silent = unfreeze(how, watched=True)
        assert not found(silent), silent.explain_failure() if silent else ""


def test_a_backbone_frozen_by_the_modules_attribute_keeps_training_and_is_found():
    def run(watched: bool) -> tuple[float, NeuralDbg | None]:
        torch.manual_seed(0)
        net = Net()
        net.blocks.requires_grad = False  # meant: net.blocks.requires_grad_(False)
        opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=3e-3)
        start = net.blocks[0][0].weight.detach().clone()

        def loop() -> None:
            for step in range(100):
                x, y = batch(step)
                opt.zero_grad()
                F.cross_entropy(net(x), y).backward()
                opt.step()

        dbg = support.watching(net, loop, watched)
        return float((net.blocks[0][0].weight.detach() - start).norm()), dbg

    assert run(watched=False)[0] > 0.05  # plain torch: the "frozen" backbone trained
    _, dbg = run(watched=True)
    hits = found(dbg)
    assert hits, dbg.explain_failure() if dbg else ""
    assert hits[0].root.detail == "blocks" and hits[0].root.metrics["value"] == 0.0
    assert "nothing was frozen" in hits[0].explanation and "requires_grad_(False)" in hits[0].suggestion


class MeanTeacher(nn.Module):
    """A student and its moving-average teacher, the teacher marked ``requires_grad = False`` as an attribute and run
    under ``no_grad``, outside the optimizer: as frozen as the attribute says, though its parameters' flags are on."""

    def __init__(self) -> None:
        super().__init__()
        self.student, self.teacher = Net(), Net()
        self.teacher.load_state_dict(self.student.state_dict())
        self.teacher.requires_grad = False

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            target = self.teacher(x)
        return self.student(x), target


def test_a_teacher_marked_by_the_attribute_that_never_gets_a_gradient_is_silent():
    torch.manual_seed(0)
    model = MeanTeacher()
    opt = torch.optim.Adam(model.student.parameters(), lr=3e-3)
    with NeuralDbg(model) as dbg:
        for step in range(100):
            x, y = batch(step)
            opt.zero_grad()
            out, target = model(x)
            (F.cross_entropy(out, y) + F.mse_loss(out, target)).backward()
            opt.step()
            with torch.no_grad():
                for t, s in zip(model.teacher.parameters(), model.student.parameters()):
                    t.lerp_(s, 0.01)
    # plain torch: every teacher parameter still has its flag on, and none ever got a gradient
    assert all(p.requires_grad and p.grad is None for p in model.teacher.parameters())
    assert dbg._recorder.coverage.switches  # the attribute was read
    assert not found(dbg), dbg.explain_failure()
