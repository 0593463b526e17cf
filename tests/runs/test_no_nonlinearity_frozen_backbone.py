"""No nonlinearity, and trained layers on a frozen backbone's features: a head with a rank-4 LoRA update, or a
linear bottleneck adapter, are the only trained layers after a frozen Linear-ReLU backbone. The autograd graph holds
only the operations on tensors that need a gradient, so the backbone's ReLUs are not in it and the trained layers
alone read as one affine map; they are a probe on the backbone's features, a design. Ground truth in plain torch:
the backbone has ReLUs, it is frozen, and the loss falls. The faulty twin, the same kind of stack without
activations trained from the raw inputs, is still found."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

KIND = "no_nonlinearity"
STEPS = 150


def shells(step: int, batch: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Two classes by the distance from the origin in 16 dimensions: no hyperplane of the inputs separates them."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(batch, 16, generator=g)
    return x, (x.norm(dim=1) > 3.9).long()


def backbone() -> nn.Sequential:
    """A "pretrained" feature extractor, frozen."""
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU()).requires_grad_(False)


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trained rank-``r`` update ``B A`` (B starts at zero)."""

    def __init__(self, base: nn.Linear, r: int = 4) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x))


class Adapted(nn.Module):
    """A frozen backbone, a residual linear bottleneck adapter (64 -> 8 -> 64) and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = backbone()
        self.adapter = nn.Sequential(nn.Linear(64, 8), nn.Linear(8, 64))
        self.head = nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.backbone(x)
        return self.head(h + self.adapter(h))


def lora_head() -> nn.Module:
    return nn.Sequential(backbone(), LoRALinear(nn.Linear(64, 2)))


def run(build, watched: bool):
    torch.manual_seed(0)
    model = build()
    trained = [p for p in model.parameters() if p.requires_grad]
    losses, dbg = support.fit(model, shells, F.cross_entropy, STEPS, torch.optim.Adam(trained, lr=1e-2), watched)
    return model, losses, dbg


def kinds(dbg) -> list[str]:
    return [h.kind.value for h in dbg.hypotheses()]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_a_lora_head_and_a_bottleneck_adapter_on_a_frozen_relu_backbone_are_not_one_affine_map():
    for build in (lora_head, Adapted):
        model, losses, _ = run(build, watched=False)
        # plain torch: the backbone has ReLUs and is frozen; only the LoRA factors or the adapter and head learn ...
        assert any(isinstance(m, nn.ReLU) for m in model.modules())
        frozen = model.backbone if isinstance(model, Adapted) else model[0]
        assert not any(p.requires_grad for p in frozen.parameters())
        # ... and the loss falls, without converging (the run is judged)
        assert mean(losses[-20:]) < 0.9 * mean(losses[:20]), build
        assert mean(losses[-20:]) > 0.01 * mean(losses[:20])

        _, watched, dbg = run(build, watched=True)
        assert watched == losses  # the debugger changes nothing
        assert KIND not in kinds(dbg), dbg.explain_failure()


def test_the_same_linear_stack_trained_from_the_raw_inputs_is_still_found():
    stack = lambda: nn.Sequential(nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 2))
    relu = lambda: nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    _, linear, _ = run(stack, watched=False)
    _, nonlinear, _ = run(relu, watched=False)
    assert mean(nonlinear[-20:]) < 0.8 * mean(linear[-20:])  # plain torch: the activations are what fits the shells

    _, watched, dbg = run(stack, watched=True)
    assert watched == linear
    assert kinds(dbg)[:1] == [KIND], dbg.explain_failure()
    assert dbg.hypotheses()[0].root.metrics["layers"] == 3


def test_two_linear_layers_on_frozen_features_are_a_linear_probe():
    """A frozen ReLU backbone, then two trained Linear layers with nothing between them: they compose into one
    linear map of the backbone's features (plain torch: a single Linear layer reproduces them), a linear probe with
    more parameters, which is a linear model by design; not reported."""
    two = lambda: nn.Sequential(backbone(), nn.Linear(64, 64), nn.Linear(64, 2))
    model, stacked, _ = run(two, watched=False)
    _, lower, upper = model
    probe = nn.Linear(64, 2)
    with torch.no_grad():
        probe.weight.copy_(upper.weight @ lower.weight)
        probe.bias.copy_(upper.weight @ lower.bias + upper.bias)
        x = shells(10_000)[0]
        assert torch.allclose(probe(model[0](x)), model(x), atol=1e-5)

    _, watched, dbg = run(two, watched=True)
    assert watched == stacked
    assert KIND not in kinds(dbg), dbg.explain_failure()
