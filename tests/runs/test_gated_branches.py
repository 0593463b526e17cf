"""Residual branches scaled by a small learnable gate (LayerScale in ConvNeXt and CaiT, ReZero, SkipInit): every
layer of the branch starts with a gradient a millionfold below the rest of the model, by construction, and the
gradient grows as the gate learns. That is no vanishing gradient; a gate that cannot learn (frozen at 1e-6) is one:
its branch never gets a usable gradient.

Ground truth by plain torch: the gradient norm of the branch's first normalisation layer at the first and the last
step (own hooks-free ``.grad`` reads), and the gate's size after training."""

from __future__ import annotations

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 30


class LayerScale(nn.Module):
    """timm's LayerScale: a per-channel learnable gate, a module of its own beside the branch's layers."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """A ConvNeXt block, channels last inside: depthwise conv, LayerNorm, pointwise MLP, gate, residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.ls = LayerScale(dim, 1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dwconv(x).permute(0, 2, 3, 1)
        h = self.ls(self.pwconv2(self.act(self.pwconv1(self.norm(h)))))
        return x + h.permute(0, 3, 1, 2)


class TimmStyleConvNeXt(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 2, stride=2)
        self.stages = nn.Sequential(Block(32), nn.Conv2d(32, 64, 2, stride=2), Block(64))
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


def hf_convnext() -> nn.Module:
    tf = pytest.importorskip("transformers")
    config = tf.ConvNextConfig(
        num_channels=3, patch_size=2, hidden_sizes=[32, 64], depths=[1, 1], num_stages=2, num_labels=10
    )
    return tf.ConvNextForImageClassification(config)


def run(
    model: nn.Module, logits, norm: str, gates: list[nn.Parameter], frozen: bool, warmup: int = 0
) -> tuple[NeuralDbg, list[float]]:
    """Train under the debugger; returns it and the gradient norm at ``norm`` per step (plain ``.grad`` reads).
    ``warmup``: the learning rate rises linearly from 0 over that many steps (ConvNeXt's and ViT's recipes)."""
    for gate in gates:
        gate.requires_grad_(not frozen)
    layer = dict(model.named_modules())[norm]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    batches = support.classification_batches((3, 16, 16), 10, batch=32)
    norms: list[float] = []
    with NeuralDbg(model) as dbg:
        for step in range(STEPS):
            x, y = batches(step)
            opt.zero_grad()
            F.cross_entropy(logits(model, x), y).backward()
            norms.append(float(torch.cat([p.grad.reshape(-1) for p in layer.parameters()]).norm()))
            opt.step()
            sched.step()
    return dbg, norms


def timm_case() -> tuple[nn.Module, object, str, list[nn.Parameter]]:
    torch.manual_seed(0)
    model = TimmStyleConvNeXt()
    gates = [m.gamma for m in model.modules() if isinstance(m, LayerScale)]
    return model, lambda m, x: m(x), "stages.0.norm", gates


def hf_case() -> tuple[nn.Module, object, str, list[nn.Parameter]]:
    torch.manual_seed(0)
    model = hf_convnext()
    gates = [p for n, p in model.named_parameters() if "layer_scale" in n]
    return model, lambda m, x: m(pixel_values=x).logits, "convnext.encoder.stages.0.layers.0.layernorm", gates


CASES = {"timm_layer_scale_module": timm_case, "hf_layer_scale_parameter": hf_case}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_branch_behind_a_small_gate_that_learns_is_not_vanishing(case: str) -> None:
    model, logits, norm, gates = CASES[case]()
    dbg, norms = run(model, logits, norm, gates, frozen=False)

    # plain torch: the branch starts a millionfold below the model's scale and grows as the gate learns
    assert norms[0] < 1e-6
    assert min(norms[-5:]) > 1e3 * norms[0]
    assert all(float(g.detach().pow(2).mean().sqrt()) > 1e-3 for g in gates)
    assert FailureKind.VANISHING_GRADIENTS.value not in support.kinds(dbg)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_branch_behind_a_frozen_small_gate_is_vanishing(case: str) -> None:
    model, logits, norm, gates = CASES[case]()
    dbg, norms = run(model, logits, norm, gates, frozen=True)

    # plain torch: the branch never gets a usable gradient
    assert max(norms) < 1e-6
    assert all(float(g.detach().abs().max()) <= 1e-6 for g in gates)
    assert FailureKind.VANISHING_GRADIENTS.value in support.kinds(dbg)


def test_a_branch_behind_a_small_gate_that_learns_slowly_under_warm_up_is_not_vanishing() -> None:
    """Under a learning-rate warm-up the gate grows slowly and its branch stays small through a smoke run: nothing
    else undoes the small start (the branch never reads healthy), so only the gate's own healthy gradient tells it
    from a fault."""
    model, logits, norm, gates = hf_case()
    dbg, norms = run(model, logits, norm, gates, frozen=False, warmup=1000)

    # plain torch: the branch stays far below the model's scale to the end, while the gate learns (it grew)
    assert max(norms) < 1e-6
    assert norms[-1] > 10 * norms[0]
    assert all(float(g.detach().pow(2).mean().sqrt()) > 10 * 1e-6 for g in gates)
    assert FailureKind.VANISHING_GRADIENTS.value not in support.kinds(dbg)


def test_a_branch_behind_a_frozen_small_gate_under_warm_up_is_vanishing() -> None:
    model, logits, norm, gates = hf_case()
    dbg, norms = run(model, logits, norm, gates, frozen=True, warmup=1000)

    assert max(norms) < 1e-6
    assert FailureKind.VANISHING_GRADIENTS.value in support.kinds(dbg)


class SquashedConvNeXt(nn.Module):
    """A ConvNeXt block (its gate at 1e-3, a CaiT-like start) under a head of three sigmoid layers: the sigmoid
    stack makes every gradient below it vanish, the gate's own included."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 2, stride=2)
        self.block = Block(32)
        with torch.no_grad():
            self.block.ls.gamma.fill_(1e-3)
        self.squash = nn.Sequential(*[m for _ in range(3) for m in (nn.Linear(32, 32), nn.Sigmoid())])
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.squash(self.block(self.stem(x)).mean((2, 3))))


def test_a_branch_behind_a_small_gate_whose_own_gradient_vanishes_is_vanishing() -> None:
    """The gate excuses its branch only while the gate itself gets a usable gradient: behind a saturated sigmoid
    stack the gate's gradient vanishes with the branch's, and the branch is part of the fault."""
    torch.manual_seed(0)
    model = SquashedConvNeXt()
    dbg, norms = run(model, lambda m, x: m(x), "block.pwconv1", [model.block.ls.gamma], frozen=False)

    # plain torch: the gate's and the branch's gradients are tiny beside the head's, above the 1e-9 floor
    gate, head = model.block.ls.gamma.grad, model.head.weight.grad
    assert gate is not None and head is not None
    assert 1e-9 < float(gate.norm()) < 1e-4 and float(gate.norm()) < 1e-3 * float(head.norm())
    assert 1e-9 < max(norms) < 1e-4
    layers = {e.layer for e in dbg.events if e.kind is FailureKind.VANISHING_GRADIENTS}
    assert {"block.pwconv1", "block.pwconv2", "block.ls"} <= layers
