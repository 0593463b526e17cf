"""Unnormalised inputs, judged by the scale the first layer with weights receives: sensor series near 290 K fed to
a classifier that standardises each series inside its forward, with RevIN (reversible instance normalisation: a
module of per-channel affine parameters that comes first) or with plain tensor ops, before its first Linear.
Ground truth is plain torch: the raw input's root-mean-square is about 290, the first Linear receives about 1 (a
forward pre-hook of our own), and the classifier learns the task (silent). The twin keeps the module's per-channel
affine but not its standardisation: the first Linear receives the raw series, and that is found."""

from __future__ import annotations

import math

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

KIND = "unnormalised_inputs"
LENGTH, CHANNELS, CLASSES = 24, 2, 3
STEPS = 40


def batch(step: int, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Series of temperatures near 290 K, (batch, time, channels): the class is the period of their oscillation."""
    g = torch.Generator().manual_seed(step)
    y = torch.randint(0, CLASSES, (size,), generator=g)
    period = torch.tensor([4.0, 8.0, 12.0])[y]
    t = torch.arange(LENGTH).float()
    phase = 6.28 * torch.rand(size, 1, CHANNELS, generator=g)
    wave = torch.sin(6.2832 * t[None, :, None] / period[:, None, None] + phase)
    level = 290 + 2 * torch.randn(size, 1, CHANNELS, generator=g)
    return level + wave + 0.1 * torch.randn(size, LENGTH, CHANNELS, generator=g), y


class RevIN(nn.Module):
    """Reversible instance normalisation's first half: each series standardised over time, then a learned
    per-channel scale and shift (``standardise=False``: the scale and shift alone)."""

    def __init__(self, standardise: bool = True) -> None:
        super().__init__()
        self.standardise = standardise
        self.weight = nn.Parameter(torch.ones(CHANNELS))
        self.bias = nn.Parameter(torch.zeros(CHANNELS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.standardise:
            mean = x.mean(1, keepdim=True).detach()
            x = (x - mean) / torch.sqrt(x.var(1, keepdim=True, unbiased=False) + 1e-5).detach()
        return x * self.weight + self.bias


class Classifier(nn.Module):
    """``normalise``: "revin" (a RevIN module first), "ops" (the same standardisation with tensor ops in forward,
    no module) or "affine" (a RevIN module that does not standardise)."""

    def __init__(self, normalise: str) -> None:
        super().__init__()
        self.normalise = normalise
        self.revin = RevIN(standardise=normalise == "revin") if normalise != "ops" else None
        self.mlp = nn.Sequential(nn.Linear(LENGTH * CHANNELS, 64), nn.ReLU(), nn.Linear(64, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.revin is None:  # each series standardised over time, no module
            return self.mlp(((x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)).flatten(1))
        return self.mlp(self.revin(x).flatten(1))


def train(model: nn.Module, watched: bool) -> tuple[list[float], float, NeuralDbg | None]:
    """Adam 3e-3: the losses, the held-out accuracy and the debugger (None when not watched)."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []

    def loop() -> None:
        for step in range(STEPS):
            x, y = batch(step)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))

    dbg = support.watching(model, loop, watched)
    x, y = batch(10_000, size=256)
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).float().mean())
    return losses, accuracy, dbg


def first_linear_rms(model: Classifier) -> float:
    """Plain torch: the root-mean-square of what the first Linear receives."""
    seen: list[float] = []
    handle = model.mlp[0].register_forward_pre_hook(lambda _, args: seen.append(float(args[0].pow(2).mean().sqrt())))
    with torch.no_grad():
        model(batch(0)[0])
    handle.remove()
    return seen[0]


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_series_standardised_by_a_revin_module_or_by_tensor_ops_are_silent():
    assert float(batch(0)[0].pow(2).mean().sqrt()) > 250  # plain torch: the raw series are at 290 K
    for normalise in ("revin", "ops"):
        torch.manual_seed(0)
        model = Classifier(normalise)
        assert 0.5 < first_linear_rms(model) < 2, normalise  # ... and the first Linear receives them standardised
        losses, accuracy, _ = train(model, watched=False)
        assert losses[0] < 1.5 * math.log(CLASSES) and accuracy > 0.9, (normalise, losses[0], accuracy)

        torch.manual_seed(0)
        _, _, dbg = train(Classifier(normalise), watched=True)
        assert dbg is not None and not found(dbg), (normalise, dbg.explain_failure())


def test_a_module_of_per_channel_affine_that_does_not_standardise_is_found():
    torch.manual_seed(0)
    model = Classifier("affine")
    assert first_linear_rms(model) > 250  # plain torch: the raw series reach the first Linear
    losses, _, _ = train(model, watched=False)
    assert losses[0] > 3 * math.log(CLASSES)  # ... and its logits start far from unit scale

    torch.manual_seed(0)
    _, _, dbg = train(Classifier("affine"), watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.metrics["input_rms"] > 250
