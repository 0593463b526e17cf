"""A loss that does not fall because most of the model never gets a gradient is explained by that, with the layers
named: blocks wrapped in ``torch.utils.checkpoint(..., use_reentrant=True)`` on an input that needs no gradient run
under ``no_grad`` and are never recomputed, so their parameters never hold one (torch only warns). Before, the
explanation said "the gradients flow and the optimizer moves the weights" and listed shuffled targets first.
Healthy twins: the same blocks checkpointed with ``use_reentrant=False``, and a backbone frozen deliberately under
``torch.no_grad()`` while the optimizer still holds it, whose head learns: both silent, as before. Ground truth in
plain torch (which parameters hold a gradient, and the loss)."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from neuraldbg import FailureKind, NeuralDbg


class _Net(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16 if i == 0 else 64, 64), nn.GELU()) for i in range(3))
        self.head = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


def _data(linear: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 16, generator=g)
    z = x @ torch.randn(16, 1, generator=g)
    return x, z / 4 if linear else torch.sin(z)


def _train(model: nn.Module, steps: int = 150, lr: float = 1e-3, linear: bool = False) -> tuple[NeuralDbg, list[float]]:
    x, y = _data(linear)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    with NeuralDbg(model) as dbg, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "None of the inputs have requires_grad")
        for i in range(steps):
            j = (i * 32) % 512
            opt.zero_grad()
            loss = F.mse_loss(model(x[j : j + 32]), y[j : j + 32])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return dbg, losses


def test_checkpointed_blocks_that_never_get_a_gradient_are_named_as_the_first_cause():
    torch.manual_seed(0)
    model = _Net(reentrant=True)
    dbg, losses = _train(model)
    without = [n for n, p in model.named_parameters() if p.grad is None]  # ground truth: the blocks never train
    assert without == [n for n, _ in model.blocks.named_parameters(prefix="blocks")]
    assert sum(losses[-20:]) / 20 > 0.9 * sum(losses[:20]) / 20  # the loss barely moves
    (root,) = dbg.get_root_causes()
    assert root.kind is FailureKind.LOSS_AT_CHANCE
    (text,) = dbg.explain_failure()
    assert "The optimizer moves the weights, but 6 of the 8 parameters it steps never held a gradient" in text
    assert "(1) layers the loss does not reach: 6 of the 8 parameters" in text
    assert "'blocks.0.0.bias', 'blocks.0.0.weight', 'blocks.1.0.bias' and 3 more" in text
    assert "gradients flow" not in text
    assert "use_reentrant=False" in text.split("Fix:")[1]


def test_the_same_blocks_checkpointed_without_reentry_train_and_are_silent():
    torch.manual_seed(0)
    model = _Net(reentrant=False)
    dbg, losses = _train(model, 200, lr=3e-3)
    assert all(p.grad is not None for p in model.parameters())
    assert sum(losses[-20:]) < 0.6 * sum(losses[:20])
    assert dbg.explain_failure() == []


def test_a_backbone_frozen_under_no_grad_while_its_head_learns_is_silent():
    """Deliberate: the backbone's parameters are still in the optimizer and never get a gradient, the loss falls
    through the head (a target its fixed features carry). Nothing to explain."""

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = nn.Sequential(nn.Linear(16, 64), nn.Tanh())
            self.head = nn.Linear(64, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                h = self.backbone(x)
            return self.head(h)

    torch.manual_seed(0)
    model = Probe()
    dbg, losses = _train(model, 200, lr=3e-3, linear=True)
    assert model.backbone[0].weight.grad is None and model.head.weight.grad is not None
    assert sum(losses[-20:]) < 0.7 * sum(losses[:20])
    assert dbg.explain_failure() == []
