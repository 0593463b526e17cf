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


def run(model: nn.Module, logits, norm: str, gates: list[nn.Parameter], frozen: bool) -> tuple[NeuralDbg, list[float]]:
    """Train under the debugger; returns it and the gradient norm at ``norm`` per step (plain ``.grad`` reads)."""
    for gate in gates:
        gate.requires_grad_(not frozen)
    layer = dict(model.named_modules())[norm]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    batches = support.classification_batches((3, 16, 16), 10, batch=32)
    norms: list[float] = []
    with NeuralDbg(model) as dbg:
        for step in range(STEPS):
            x, y = batches(step)
            opt.zero_grad()
            F.cross_entropy(logits(model, x), y).backward()
            norms.append(float(torch.cat([p.grad.reshape(-1) for p in layer.parameters()]).norm()))
            opt.step()
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
