"""A plain-torch judge of one training run, written without NeuralDBG: confirmed healthy, confirmed faulty, or
neither (discarded).

It watches the run with forward hooks of its own, reads ``p.grad`` before each optimizer step and compares
parameter copies after it, and measures:

* the gradient norm of every parametric module (its own parameters) at every step;
* unit activity of ReLU-family outputs (``nn.ReLU``, ``ReLU6``, ``LeakyReLU(0)`` and blocks that apply
  ``F.relu`` last): which units (features, or channels of a map) were ever positive, over every sample of a step;
* saturation of hidden tanh and sigmoid outputs: the fraction of outputs where the derivative is below a
  fraction of its maximum;
* the update/weight ratio ||dW|| / ||W|| of the whole model at every step;
* the loss at every step.

Its thresholds are its own, chosen from what the quantities mean and set well apart so that a run between them
is *neither* rather than guessed; they are deliberately not NeuralDBG's (``neuraldbg/config.py``).

**Confirmed healthy** means all of:

* every loss and gradient is finite, and the loss does not diverge: no 3-step mean of it exceeds 10x the first
  one (single batches of one sample vary too much to compare one loss with another);
* no gradient is large: every module's gradient norm stays below 100;
* no gradient is small, except by construction: at every step (but isolated single steps: a vanishing gradient
  is a state, a batch that silences a layer once is not) every module's gradient is at least 1e-2 of the
  largest module's, or at least 1e-3 in absolute terms, or the module is *inert*: perturbing its parameters
  (each element scaled by e^(0.3 z), z standard normal, so its sign is kept) moves the model's output on a batch
  of at least 8 samples by less than 1e-4 of its size. Inert parameters are redundant by construction (a bias
  or an affine norm right before a BatchNorm, which normalises it away): their gradient is 0 up to rounding,
  and nothing is lost;
* no ReLU-family output has more than 30% of its units that were positive on no sample of the second half of
  the run (at least 8 samples);
* no hidden tanh/sigmoid has more than 25% of its outputs where the derivative is below 2% of its maximum;
* updates move the weights: the model's update/weight ratio is above 1e-5 at every step, and below 0.1.

**Confirmed faulty** means at least one of, each named by the failure kind it is:

* ``non_finite``: a loss, output or gradient is inf/NaN;
* ``exploding_gradients``: some module's gradient norm exceeds 1e4;
* ``vanishing_gradients``: a module that is not inert has a gradient below 1e-6 in absolute terms and below
  1e-5 of the largest module's at 80% of the steps or more, including the last 5;
* ``dead_neurons``: a ReLU-family output whose units are at least 90% positive on no sample, for 5 or more
  consecutive steps up to the end of the run (checked per step, at least 2 samples a step);
* ``saturated_activations``: a hidden tanh/sigmoid with more than 90% of its outputs where the derivative is
  below 1e-3 of its maximum, at 80% of the steps or more;
* ``stalled_updates``: the model's update/weight ratio is below 1e-7 at every step.

Everything else is *neither*; the property tests discard it and report how often that happens.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from fuzz_models import BuiltRun, LinearThenFunctionalReLU, Observer, main_output, train
from torch import nn

# healthy
MAX_HEALTHY_GRAD = 1e2
MIN_HEALTHY_RATIO = 1e-2
MIN_HEALTHY_NORM = 1e-3
MAX_HEALTHY_DEAD = 0.3
MAX_HEALTHY_SATURATED = 0.25
HEALTHY_SATURATION_DERIVATIVE = 0.02
MIN_HEALTHY_UPDATE, MAX_HEALTHY_UPDATE = 1e-5, 0.1
MAX_LOSS_GROWTH = 10.0
INERT_CHANGE = 1e-4
INERT_BATCHES = 8
# faulty
EXPLODING_GRAD = 1e4
VANISHING_NORM, VANISHING_RATIO = 1e-6, 1e-5
DEAD_FRACTION, DEAD_STEPS = 0.9, 5
SATURATED_FRACTION, FAULTY_SATURATION_DERIVATIVE = 0.9, 1e-3
STALLED_UPDATE = 1e-7
MOST_STEPS = 0.8

HEALTHY, FAULTY, NEITHER = "healthy", "faulty", "neither"


@dataclass
class Verdict:
    label: str  # HEALTHY, FAULTY or NEITHER
    kinds: set[str] = field(default_factory=set)  # failure kinds, when faulty
    reasons: list[str] = field(default_factory=list)  # why not healthy (for faulty and neither)

    def __str__(self) -> str:
        kinds = f" {sorted(self.kinds)}" if self.kinds else ""
        return f"{self.label}{kinds}: {'; '.join(self.reasons[:4]) or 'all checks passed'}"


def _gated(module: nn.Module) -> bool:
    return isinstance(module, (nn.ReLU, nn.ReLU6, LinearThenFunctionalReLU)) or (
        isinstance(module, nn.LeakyReLU) and module.negative_slope == 0
    )


def _units(t: torch.Tensor) -> torch.Tensor:
    """(samples, units): units are the last dim of dense outputs, channels of (batch, channels, h, w) maps; a
    unit is active on a sample when it is positive anywhere in that sample."""
    if t.dim() == 4:
        return t.amax(dim=(2, 3))
    if t.dim() == 3:
        return t.amax(dim=1)
    return t.reshape(-1, t.shape[-1])


class PlainTorchProbe(Observer):
    """Hooks and copies that record one run. Reads only; draws no random numbers; changes nothing."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.modules = {
            name: [p for p in m.parameters(recurse=False) if p.requires_grad]
            for name, m in model.named_modules()
            if any(True for _ in m.parameters(recurse=False))
        }
        self.grads: dict[str, list[float]] = {n: [] for n in self.modules}
        self.update_ratio: list[float] = []
        self.losses: list[float] = []
        self.non_finite = False
        # per gated output (name, call): per step, which units were active; per bounded output: saturation
        self.active_step: dict[tuple[str, int], torch.Tensor] = {}
        self.samples_step: dict[tuple[str, int], int] = {}
        self.active: dict[tuple[str, int], list[tuple[torch.Tensor, int]]] = {}
        self.saturation: dict[tuple[str, int], list[tuple[float, float]]] = {}
        self.saturation_step: dict[tuple[str, int], list[tuple[float, float]]] = {}
        self._calls: dict[str, int] = {}
        self._before: list[torch.Tensor] = []
        self._handles = [model.register_forward_pre_hook(self._start)]
        for name, m in model.named_modules():
            if _gated(m) or isinstance(m, (nn.Tanh, nn.Sigmoid)):
                self._handles.append(m.register_forward_hook(self._watch(name, m)))
        self._handles.append(model.register_forward_hook(self._end))

    def _start(self, module: nn.Module, args: Any) -> None:
        self._calls = {}

    def _end(self, module: nn.Module, args: Any, output: Any) -> None:
        out = main_output(output)
        if not bool(torch.isfinite(out.detach()).all()):
            self.non_finite = True

    def _watch(self, name: str, module: nn.Module) -> Any:
        def hook(m: nn.Module, args: Any, output: torch.Tensor) -> None:
            call = self._calls.get(name, 0)
            self._calls[name] = call + 1
            key = (name, call)
            with torch.no_grad():
                t = output.detach()
                if _gated(m):
                    active = (_units(t) > 0).any(dim=0)
                    prev = self.active_step.get(key)
                    self.active_step[key] = active if prev is None else prev | active
                    self.samples_step[key] = self.samples_step.get(key, 0) + t.shape[0]
                else:
                    y = t.float()
                    derivative = 1 - y * y if isinstance(m, nn.Tanh) else 4 * y * (1 - y)  # relative to the max
                    low = float((derivative < HEALTHY_SATURATION_DERIVATIVE).float().mean())
                    very_low = float((derivative < FAULTY_SATURATION_DERIVATIVE).float().mean())
                    self.saturation_step.setdefault(key, []).append((low, very_low))

        return hook

    def before_step(self, step: int, loss: float) -> None:
        self.losses.append(loss)
        if not math.isfinite(loss):
            self.non_finite = True
        for name, params in self.modules.items():
            grads = [p.grad for p in params if p.grad is not None]
            if not grads:
                continue
            norm = math.sqrt(sum(float(g.detach().double().pow(2).sum()) for g in grads))
            self.grads[name].append(norm)
            if not math.isfinite(norm):
                self.non_finite = True
        self._before = [p.detach().clone() for p in self.model.parameters()]
        for key, active in self.active_step.items():
            self.active.setdefault(key, []).append((active, self.samples_step[key]))
        for key, values in self.saturation_step.items():
            n = len(values)
            self.saturation.setdefault(key, []).append((sum(v[0] for v in values) / n, sum(v[1] for v in values) / n))
        self.active_step, self.samples_step, self.saturation_step = {}, {}, {}

    def after_step(self, step: int) -> None:
        after = list(self.model.parameters())
        delta = math.sqrt(sum(float((a.detach() - b).double().pow(2).sum()) for a, b in zip(after, self._before)))
        weight = math.sqrt(sum(float(b.double().pow(2).sum()) for b in self._before))
        self.update_ratio.append(delta / weight if weight > 0 else math.inf)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def inert(run: BuiltRun, module_name: str) -> bool:
    """Whether the loss's input cannot see ``module_name``'s parameters: scaling each element by a random factor
    e^(0.3 z) (signs kept) moves the output of a training-mode forward pass (the same batch of at least 8
    samples, the same dropout draws) by less than ``INERT_CHANGE`` of its size. Run on a copy, so the trained
    model is untouched."""
    model = copy.deepcopy(run.model)
    x = torch.cat([run.batch(step, 0)[0] for step in range(INERT_BATCHES)])  # a batch norm over a batch of one
    # or two samples erases almost anything; the cancellations by construction hold for any batch
    gen = torch.Generator().manual_seed(12345)

    def forward() -> torch.Tensor:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(0)
            return main_output(model(x)).detach().double().clone()

    reference = forward()
    module = dict(model.named_modules())[module_name]
    with torch.no_grad():
        for p in module.parameters(recurse=False):
            p.mul_(torch.exp(0.3 * torch.randn(p.shape, generator=gen)))
    moved = forward()
    size = float(reference.norm())
    return size > 0 and float((moved - reference).norm()) < INERT_CHANGE * size


def judge(run: BuiltRun) -> tuple[Verdict, list[float], PlainTorchProbe]:
    """Train ``run`` once under the probe (this is also the reference run without a debugger) and judge it."""
    probe = PlainTorchProbe(run.model)
    try:
        losses = train(run, probe)
    finally:
        probe.remove()
    return verdict(run, probe), losses, probe


def verdict(run: BuiltRun, probe: PlainTorchProbe) -> Verdict:
    faulty: set[str] = set()
    unhealthy: list[str] = []
    steps = len(probe.losses)
    if probe.non_finite:
        return Verdict(FAULTY, {"non_finite"}, ["a loss, output or gradient is not finite"])
    windows = [sum(probe.losses[i : i + 3]) / 3 for i in range(steps - 2)]
    if max(windows) > MAX_LOSS_GROWTH * max(windows[0], 1e-12):
        unhealthy.append(f"the loss grows to {max(windows) / windows[0]:.1f}x its first value (3-step means)")
    # gradients
    per_step = [{n: g[s] for n, g in probe.grads.items() if len(g) == steps} for s in range(steps)]
    top = [max(d.values(), default=0.0) for d in per_step]
    largest = max(top, default=0.0)
    if largest > EXPLODING_GRAD:
        faulty.add("exploding_gradients")
        unhealthy.append(f"gradient norm {largest:.3g} > {EXPLODING_GRAD:g}")
    elif largest > MAX_HEALTHY_GRAD:
        unhealthy.append(f"gradient norm {largest:.3g} > {MAX_HEALTHY_GRAD:g}")
    small: dict[str, list[bool]] = {}
    tiny: dict[str, list[bool]] = {}
    for s, d in enumerate(per_step):
        for name, g in d.items():
            small.setdefault(name, []).append(g < MIN_HEALTHY_NORM and g < MIN_HEALTHY_RATIO * top[s])
            tiny.setdefault(name, []).append(g < VANISHING_NORM and g < VANISHING_RATIO * top[s])
    for name, flags in small.items():
        if not any(a and b for a, b in itertools.pairwise(flags)):
            continue  # never small two steps in a row
        if inert(run, name):
            tiny.pop(name, None)
            continue
        unhealthy.append(f"'{name}' gets a small gradient at {sum(flags)}/{steps} steps")
    for name, flags in tiny.items():
        if sum(flags) >= MOST_STEPS * steps and all(flags[-5:]):
            faulty.add("vanishing_gradients")
            unhealthy.append(f"'{name}' gradient < {VANISHING_NORM:g} and < {VANISHING_RATIO:g} of the largest")
    # dead units
    for key, series in probe.active.items():
        half = series[len(series) // 2 :]
        samples = sum(n for _, n in half)
        if samples >= 8:
            ever = torch.stack([a for a, _ in half]).any(dim=0)
            fraction = 1 - float(ever.float().mean())
            if fraction > MAX_HEALTHY_DEAD:
                unhealthy.append(f"{key}: {fraction:.0%} of units never active in the second half")
        dead_run = 0
        for active, n in series:
            dead = 1 - float(active.float().mean())
            dead_run = dead_run + 1 if dead >= DEAD_FRACTION and n >= 2 else 0
        if dead_run >= DEAD_STEPS:
            faulty.add("dead_neurons")
            unhealthy.append(f"{key}: >= {DEAD_FRACTION:.0%} dead units over the last {dead_run} steps")
    # saturation (every tanh/sigmoid of these models feeds a later layer)
    for key, series in probe.saturation.items():
        mean_low = sum(v[0] for v in series) / len(series)
        if mean_low > MAX_HEALTHY_SATURATED:
            unhealthy.append(f"{key}: {mean_low:.0%} of outputs near saturation")
        if sum(v[1] > SATURATED_FRACTION for v in series) >= MOST_STEPS * len(series):
            faulty.add("saturated_activations")
    # updates
    ratios = probe.update_ratio
    if max(ratios) < STALLED_UPDATE:
        faulty.add("stalled_updates")
    if min(ratios) < MIN_HEALTHY_UPDATE:
        unhealthy.append(f"update/weight ratio down to {min(ratios):.2g}")
    if max(ratios) > MAX_HEALTHY_UPDATE:
        unhealthy.append(f"update/weight ratio up to {max(ratios):.2g}")
    if faulty:
        return Verdict(FAULTY, faulty, unhealthy)
    if unhealthy:
        return Verdict(NEITHER, set(), unhealthy)
    return Verdict(HEALTHY)
