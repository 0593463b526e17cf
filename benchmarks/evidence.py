"""Plain-torch evidence that each scenario's ground truth is right.

``python -m benchmarks.evidence [NAME ...]`` re-runs scenarios with forward hooks and a training-loop probe
(no ``neuraldbg`` import) and prints, per scenario, what was measured and any contradiction with its ground
truth.

Definitions (the ones the ground truths are written against):

* a ReLU unit (feature, or channel of a conv map) is *dead* at a step when it is active (> 0) on no element
  of the step's batch; for a layer feeding a functional ``F.relu`` the same is measured on its output;
* a tanh element is *saturated* when ``|tanh| > 0.995``, a sigmoid element when outside ``[0.0025, 0.9975]``;
* the first non-finite value is located at the input (``""``), at the first module in forward order whose
  output is non-finite, at the loss (``""``) when every module output is finite, or at the gradients;
* a module's update at step ``k`` is the change ``optimizer.step()`` made to its own (non-recursive) trainable
  parameters; the update ratio is ``||dW|| / ||W||``;
* *vanishing* compares the gradient norm of the first parametrised module in forward order with the last one;
  where a truth names root modules and the gradient still reaches the first module (a branch cut off while a
  residual connection carries the gradient around it), the roots' gradient norms are compared with the last
  module's instead;
* *exploding* compares the total gradient norm with 1e3 times the loss's own gradient scale: the norm of
  d(loss)/d(output), when above 1, the smallest so far. A loss summed over N elements multiplies every gradient
  by N (its mean's gradient is below 1 in every scenario here); the loss's reduction is fixed for a run, while
  a real explosion inflates that gradient as well, hence the smallest so far;
* a parameter's gradient is *carried over* (not zeroed) at step ``k`` when, at the start of the step's backward
  pass (when the gradient of the model's output is computed, before any parameter of the model gets its share),
  its ``.grad`` is exactly equal (``torch.equal``) to the non-zero gradient it held after the previous step's
  backward pass, i.e. the one the optimizer applied, while the parameter itself changed since (the optimizer
  stepped). Zeroed gradients (``None`` or all zeros) and accumulation over micro-batches (no step in between)
  never match; a missing ``zero_grad()`` matches at every step.

Thresholds follow the published defaults collected in ``shared/guide/DETECTION.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from benchmarks.scenarios import SCENARIOS, get
from benchmarks.scenarios.base import GroundTruth, Run, Scenario

DEAD_FRACTION = 0.5  # smdebug: the layer fires when > 50 % of its units are dead
SATURATED_FRACTION = 0.5  # smdebug / DeepDiagnosis: > 50 % of the layer
TANH_LIMIT = 0.995
SIGMOID_LOW, SIGMOID_HIGH = 0.0025, 0.9975
EXPLODING_NORM = 1e3  # the seeds' exploding default
VANISHING_RATIO = 1e-3  # AUTOTRAINER: first-layer / last-layer gradient-norm ratio
STALLED_RATIO = 1e-5  # DeepDiagnosis' lower bound on the update/weight ratio
HEALTHY_RATIO = 1e-4  # a healthy run updates clearly above the stall bound (a decade of margin)
STALL_WINDOW = 5  # a stall: every update ratio in this many consecutive steps is below the bound
FROZEN_WINDOW = 3  # smdebug: unchanged over 3 saved steps
LOSS_DROP = 0.8  # a healthy run ends with (mean of last 5 losses) <= 0.8 x (mean of first 5)
CONVERGED = 1e-2  # a loss below 1 % of its start is converged, not stalled


@dataclass
class Evidence:
    """What one instrumented run of a scenario showed. Per-step lists are indexed by step."""

    name: str
    steps: int
    losses: list[float]
    order: list[str]  # hook keys in forward order at step 0 ("name", "name#1" for a module's second call)
    kinds_of: dict[str, str]  # hook key -> module class name
    dead: dict[str, list[float]]  # hook key -> fraction of dead units (ReLU modules and pre-activations)
    saturated: dict[str, list[float]]  # hook key (Tanh/Sigmoid modules) -> fraction of saturated elements
    zeros: dict[str, list[float]]  # hook key (ReLU modules) -> fraction of zero elements (sparsity, not death)
    output_keys: set[str]  # hook keys whose output is the model's output
    nonfinite_step: int | None
    nonfinite_origin: str | None  # "" for the input or the loss, else a module name
    nonfinite_source: str | None  # "input", "module", "loss" or "gradient"
    loss_grad: list[float]  # per step: norm of d(loss)/d(model output), the largest over the step's forwards
    param_modules: list[str]  # modules with direct trainable parameters, in forward order
    grad_norm: dict[str, list[float]]  # module -> norm of its direct parameters' gradients (nan: no gradient)
    param_grad_norm: dict[str, list[float]]  # parameter (qualified name) -> norm of its gradient
    total_grad_norm: list[float]
    update_ratio: dict[str, list[float]]  # module -> ||dW|| / ||W|| of the step's optimizer update
    total_update_ratio: list[float]
    changed: dict[str, list[bool]]  # module -> whether the step's update changed any of its parameters
    frozen_by_design: list[str]  # modules whose parameters all have requires_grad=False
    init_gain: dict[str, float]  # Linear/Conv module -> weight std x sqrt(fan_in) at step 0
    carried: list[int]  # per step: parameters whose gradient was carried over into the step's backward pass
    probed_seconds: float = 0.0  # wall time of the instrumented run

    @property
    def horizon(self) -> int:
        """Steps before the first non-finite value (statistics after it are meaningless)."""
        return self.steps if self.nonfinite_step is None else self.nonfinite_step


# ------------------------------------------------------------------------------------------------ recording


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def inactive_units(t: torch.Tensor) -> torch.Tensor | None:
    """Bool per unit: never active (> 0) in the batch. Units are channels of 4-d maps, else the last dim."""
    if t.ndim < 2 or not t.is_floating_point():
        return None
    active = t > 0
    dims = (0, 2, 3) if t.ndim == 4 else tuple(range(t.ndim - 1))
    return ~active.any(dim=dims)


def saturated_fraction(module: nn.Module, t: torch.Tensor) -> float | None:
    """Fraction of saturated elements of a Tanh/Sigmoid module's output; None for any other module."""
    if isinstance(module, nn.Tanh):
        return (t.abs() > TANH_LIMIT).float().mean().item()
    if isinstance(module, nn.Sigmoid):
        return ((t < SIGMOID_LOW) | (t > SIGMOID_HIGH)).float().mean().item()
    return None


def _norm(tensors: Iterable[torch.Tensor]) -> float:
    total = 0.0
    for t in tensors:
        total += t.detach().double().pow(2).sum().item()
    return math.sqrt(total)


def _ratio(change: float, size: float) -> float:
    if not (math.isfinite(change) and math.isfinite(size)):
        return math.nan
    if size > 0:
        return change / size
    return math.inf if change > 0 else 0.0


class _Recorder:
    """Forward hooks on every module plus the per-step probe; turns one run into :class:`Evidence`."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.names = {m: n for n, m in model.named_modules()}
        self.params = {
            name: [p for p in m.parameters(recurse=False) if p.requires_grad] for m, name in self.names.items()
        }
        self.params = {n: ps for n, ps in self.params.items() if ps}
        self.param_names = {p: n for n, p in model.named_parameters() if p.requires_grad}
        self.param_grad_norm: dict[str, list[float]] = {n: [] for n in self.param_names.values()}
        self.frozen_by_design = [
            n
            for m, n in self.names.items()
            if list(m.parameters(recurse=False)) and not any(p.requires_grad for p in m.parameters(recurse=False))
        ]
        self.step = 0
        self.order: list[str] = []
        self.kinds_of: dict[str, str] = {}
        self.calls: dict[str, int] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self.output_keys: set[str] = set()
        self.step_inactive: dict[str, torch.Tensor] = {}
        self.step_saturation: dict[str, list[float]] = {}
        self.step_zeros: dict[str, list[float]] = {}
        self.dead: dict[str, list[float]] = {}
        self.zeros: dict[str, list[float]] = {}
        self.saturated: dict[str, list[float]] = {}
        self.nonfinite_step: int | None = None
        self.nonfinite_origin: str | None = None
        self.nonfinite_source: str | None = None
        self.step_nonfinite: tuple[str, str] | None = None
        self.losses: list[float] = []
        self.loss_grad: list[float] = []
        self.step_loss_grad: list[float] = []
        self.grad_norm: dict[str, list[float]] = {n: [] for n in self.params}
        self.total_grad_norm: list[float] = []
        self.update_ratio: dict[str, list[float]] = {n: [] for n in self.params}
        self.total_update_ratio: list[float] = []
        self.changed: dict[str, list[bool]] = {n: [] for n in self.params}
        self.snapshot: dict[str, list[torch.Tensor]] | None = None
        self.carried: list[int] = []
        self.step_carried: int | None = None  # set at the first backward pass of the step
        self.applied: dict[nn.Parameter, tuple[torch.Tensor, torch.Tensor]] = {}  # gradient and value at the probe
        self.handles = [model.register_forward_pre_hook(self._pre_forward)]
        self.handles += [m.register_forward_hook(self._make_hook(n, m)) for m, n in self.names.items()]

    # -- forward -------------------------------------------------------------------------------------------
    def _pre_forward(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        self.calls = {}
        self.outputs = {}
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if x is not None and x.is_floating_point() and not torch.isfinite(x).all():
            self._flag_nonfinite("", "input")

    def _flag_nonfinite(self, origin: str, source: str) -> None:
        if self.step_nonfinite is None:
            self.step_nonfinite = (origin, source)

    def _make_hook(self, name: str, module: nn.Module) -> Any:
        def hook(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            with torch.no_grad():
                self._observe(name, module, out)

        return hook

    def _observe(self, name: str, module: nn.Module, out: Any) -> None:
        call = self.calls.get(name, 0)
        self.calls[name] = call + 1
        key = name if call == 0 else f"{name}#{call}"
        t = _first_tensor(out)
        if self.step == 0 and key not in self.kinds_of:
            self.order.append(key)
            self.kinds_of[key] = type(module).__name__
        if t is None or not t.is_floating_point():
            return
        if name == "":  # the model itself: note which submodule outputs it returns as they are
            if t.requires_grad:
                t.register_hook(lambda g: self.step_loss_grad.append(_norm([g])))
                t.register_hook(lambda g: self._start_backward())
            self.output_keys |= {k for k, o in self.outputs.items() if o is t}
            if not torch.isfinite(t).all():  # made non-finite by the model's own forward code
                self._flag_nonfinite("", "module")
            return
        self.outputs[key] = t
        if not torch.isfinite(t).all():
            self._flag_nonfinite(name, "module")
        inactive = None if isinstance(module, (nn.Tanh, nn.Sigmoid)) else inactive_units(t)
        if inactive is not None:
            prev = self.step_inactive.get(key)
            self.step_inactive[key] = inactive if prev is None or prev.shape != inactive.shape else prev & inactive
        sat = saturated_fraction(module, t)
        if sat is not None:
            self.step_saturation.setdefault(key, []).append(sat)
        if isinstance(module, nn.ReLU):
            self.step_zeros.setdefault(key, []).append((t == 0).float().mean().item())

    # -- backward -----------------------------------------------------------------------------------------
    def _start_backward(self) -> None:
        """At the step's first backward pass, before any parameter of the model gets its gradient: count the
        parameters whose .grad is still the non-zero gradient applied at the previous step, though they changed."""
        if self.step_carried is not None:
            return
        carried = 0
        with torch.no_grad():
            for p, (grad, value) in self.applied.items():
                if p.grad is not None and torch.equal(p.grad, grad) and not torch.equal(p, value):
                    carried += 1
        self.step_carried = carried

    def _keep_applied(self) -> None:
        """The gradients the optimizer is about to apply (non-zero ones), with the parameters' values."""
        self.applied = {
            p: (p.grad.detach().clone(), p.detach().clone())
            for p in self.param_names
            if p.grad is not None and bool(p.grad.detach().ne(0).any())
        }

    # -- per step ------------------------------------------------------------------------------------------
    def probe(self, step: int, model: nn.Module, loss: torch.Tensor) -> None:
        value = float(loss.detach().float().item())
        self.losses.append(value)
        self.loss_grad.append(max(self.step_loss_grad, default=math.nan))
        self.step_loss_grad = []
        if not math.isfinite(value):
            self._flag_nonfinite("", "loss")
        self._record_gradients()
        self._record_updates()
        self._close_forward_stats(step)
        self.snapshot = {n: [p.detach().clone() for p in ps] for n, ps in self.params.items()}
        self.carried.append(self.step_carried or 0)
        self.step_carried = None
        self._keep_applied()
        self.step = step + 1

    def _record_gradients(self) -> None:
        total = 0.0
        seen = False
        bad: list[str] = []
        for name, ps in self.params.items():
            squares = []
            for p in ps:
                norm = _norm([p.grad]) if p.grad is not None else math.nan
                self.param_grad_norm[self.param_names[p]].append(norm)
                if p.grad is not None:
                    squares.append(norm * norm)
            module_norm = math.sqrt(sum(squares)) if squares else math.nan
            self.grad_norm[name].append(module_norm)
            if squares:
                seen = True
                total += module_norm * module_norm
                if not math.isfinite(module_norm):
                    bad.append(name)
        self.total_grad_norm.append(math.sqrt(total) if seen else math.nan)
        if bad:
            self._flag_nonfinite(bad[-1], "gradient")

    def _record_updates(self) -> None:
        if self.snapshot is None:
            return
        d_total = w_total = 0.0
        for name, ps in self.params.items():
            before = self.snapshot[name]
            d = _norm(p - b for p, b in zip(ps, before, strict=True))
            w = _norm(before)
            self.update_ratio[name].append(_ratio(d, w))
            self.changed[name].append(not all(torch.equal(p, b) for p, b in zip(ps, before, strict=True)))
            d_total += d * d
            w_total += w * w
        self.total_update_ratio.append(_ratio(math.sqrt(d_total), math.sqrt(w_total)))

    def _close_forward_stats(self, step: int) -> None:
        for key, inactive in self.step_inactive.items():
            self.dead.setdefault(key, [math.nan] * step).append(inactive.float().mean().item())
        for key, sats in self.step_saturation.items():
            self.saturated.setdefault(key, [math.nan] * step).append(sum(sats) / len(sats))
        for key, zeros in self.step_zeros.items():
            self.zeros.setdefault(key, [math.nan] * step).append(sum(zeros) / len(zeros))
        self.step_inactive = {}
        self.step_saturation = {}
        self.step_zeros = {}
        if self.step_nonfinite is not None and self.nonfinite_step is None:
            self.nonfinite_step = step
            self.nonfinite_origin, self.nonfinite_source = self.step_nonfinite
        self.step_nonfinite = None

    def finish(self) -> None:
        self._record_updates()
        for h in self.handles:
            h.remove()


def _init_gain(model: nn.Module) -> dict[str, float]:
    gains = {}
    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            w = m.weight.detach()
            fan_in = w[0].numel()
            gains[name] = float(w.std().item() * math.sqrt(fan_in))
    return gains


def measure(scenario: Scenario) -> Evidence:
    """Run ``scenario`` once with plain-torch probes and return what it showed."""
    run = scenario.build()
    gains = _init_gain(run.model)
    rec = _Recorder(run.model)
    start = time.perf_counter()
    try:
        run.train(probe=rec.probe)
    finally:
        rec.finish()
    seconds = time.perf_counter() - start
    order_index = {k: i for i, k in enumerate(rec.order)}
    param_modules = sorted(rec.params, key=lambda n: order_index.get(n, len(order_index)))
    return Evidence(
        name=scenario.name,
        steps=len(rec.losses),
        losses=rec.losses,
        order=rec.order,
        kinds_of=rec.kinds_of,
        dead=rec.dead,
        saturated=rec.saturated,
        zeros=rec.zeros,
        output_keys=rec.output_keys,
        nonfinite_step=rec.nonfinite_step,
        nonfinite_origin=rec.nonfinite_origin,
        nonfinite_source=rec.nonfinite_source,
        loss_grad=rec.loss_grad,
        param_modules=param_modules,
        grad_norm=rec.grad_norm,
        param_grad_norm=rec.param_grad_norm,
        total_grad_norm=rec.total_grad_norm,
        update_ratio=rec.update_ratio,
        total_update_ratio=rec.total_update_ratio,
        changed=rec.changed,
        frozen_by_design=rec.frozen_by_design,
        init_gain=gains,
        carried=rec.carried,
        probed_seconds=seconds,
    )


def train_seconds(scenario: Scenario) -> float:
    """Wall time of ``build().train()`` without any probe."""
    run = scenario.build()
    start = time.perf_counter()
    run.train()
    return time.perf_counter() - start


# ------------------------------------------------------------------------------------------------- symptoms


def _module(key: str) -> str:
    return key.split("#", 1)[0]


def _first(values: Iterable[bool]) -> int | None:
    return next((i for i, v in enumerate(values) if v), None)


def dead_series(ev: Evidence, roots: Iterable[str] | None = None, *, relu_only: bool = False) -> dict[str, list[float]]:
    """Dead-unit fractions of the hook keys belonging to ``roots`` (all keys when None)."""
    keep = None if roots is None else set(roots)
    return {
        k: v
        for k, v in ev.dead.items()
        if (keep is None or _module(k) in keep) and (not relu_only or ev.kinds_of.get(k) == "ReLU")
    }


def first_dead_step(ev: Evidence, series: dict[str, list[float]]) -> int | None:
    steps = [_first(f >= DEAD_FRACTION for f in v[: ev.horizon]) for v in series.values()]
    found = [s for s in steps if s is not None]
    return min(found) if found else None


def hidden_saturation(ev: Evidence) -> dict[str, list[float]]:
    return {k: v for k, v in ev.saturated.items() if k not in ev.output_keys}


def first_saturated(ev: Evidence, series: dict[str, list[float]]) -> tuple[int, str] | None:
    """(step, hook key) of the first saturated activation, the earliest in forward order on a tie."""
    best: tuple[int, int, str] | None = None
    for key, values in series.items():
        s = _first(f >= SATURATED_FRACTION for f in values[: ev.horizon])
        if s is not None:
            cand = (s, ev.order.index(key) if key in ev.order else 10**6, key)
            best = cand if best is None or cand < best else best
    return None if best is None else (best[0], best[2])


def depth_ratio(ev: Evidence) -> list[float]:
    """Per step: gradient norm of the first parametrised module in forward order / that of the last one.

    Only modules that were called (so have a place in forward order) and had a gradient at step 0 take part.
    """
    mods = [m for m in ev.param_modules if m in ev.order and not math.isnan(ev.grad_norm[m][0])]
    if len(mods) < 2:
        return [1.0] * ev.steps
    first, last = ev.grad_norm[mods[0]], ev.grad_norm[mods[-1]]
    return [a / b if b > 0 else math.nan for a, b in zip(first, last, strict=True)]


def first_vanishing_step(ev: Evidence) -> int | None:
    return _first(r < VANISHING_RATIO for r in depth_ratio(ev)[: ev.horizon])


def loss_scale(ev: Evidence) -> list[float]:
    """Per step: the loss's gradient scale, max(1, the smallest finite d(loss)/d(output) norm so far)."""
    smallest, out = math.inf, []
    for g in ev.loss_grad:
        if math.isfinite(g) and g > 0:
            smallest = min(smallest, g)
        out.append(max(1.0, smallest if math.isfinite(smallest) else 1.0))
    return out


def first_exploding_step(ev: Evidence) -> int | None:
    """First step (before the first non-finite value) whose total gradient norm exceeds the threshold times the
    loss's gradient scale."""
    scales = loss_scale(ev)
    return _first(g > EXPLODING_NORM * k for g, k in zip(ev.total_grad_norm[: ev.horizon], scales, strict=False))


def frozen_onset(ev: Evidence, module: str) -> int | None:
    """First step from which ``module`` never changes again (before the horizon) though it gets gradient."""
    changed = ev.changed.get(module, [])[: ev.horizon]
    grads = ev.grad_norm.get(module, [])[: ev.horizon]
    if not changed or changed[-1]:
        return None
    start = len(changed)
    while start > 0 and not changed[start - 1]:
        start -= 1
    window_grads = grads[start:]
    if len(changed) - start < FROZEN_WINDOW or not any(math.isfinite(g) and g > 0 for g in window_grads):
        return None
    return start


def frozen_modules(ev: Evidence) -> dict[str, int]:
    return {m: s for m in ev.changed if (s := frozen_onset(ev, m)) is not None}


def first_stalled_step(ev: Evidence) -> int | None:
    """First step from which every total update ratio in a window is below the stall bound, the loss being
    still far from converged."""
    ratios = ev.total_update_ratio[: ev.horizon]
    floor = CONVERGED * ev.losses[0] if ev.losses and math.isfinite(ev.losses[0]) else 0.0
    for s in range(max(0, len(ratios) - STALL_WINDOW + 1)):
        window = ratios[s : s + STALL_WINDOW]
        if max(window) < STALLED_RATIO and ev.losses[s] > floor:
            return s
    return None


def first_carried_step(ev: Evidence) -> int | None:
    """First step (before the first non-finite value) whose backward pass started from carried-over gradients."""
    return _first(n > 0 for n in ev.carried[: ev.horizon])


def symptoms(ev: Evidence) -> dict[str, int]:
    """Every failure kind the evidence shows (before the first non-finite value), with its first step."""
    found: dict[str, int | None] = {
        "non_finite": ev.nonfinite_step,
        "exploding_gradients": first_exploding_step(ev),
        "dead_neurons": first_dead_step(ev, dead_series(ev, relu_only=True)),
        "vanishing_gradients": first_vanishing_step(ev),
        "stalled_updates": first_stalled_step(ev),
        "gradients_not_zeroed": first_carried_step(ev),
    }
    sat = first_saturated(ev, hidden_saturation(ev))
    found["saturated_activations"] = None if sat is None else sat[0]
    frozen = frozen_modules(ev)
    found["frozen_parameters"] = min(frozen.values()) if frozen else None
    return {k: v for k, v in found.items() if v is not None}


# ---------------------------------------------------------------------------------------------------- check


def _in(step: int | None, onset: tuple[int, int] | None) -> bool:
    return step is not None and (onset is None or onset[0] <= step <= onset[1])


def _loss_drop(ev: Evidence) -> float:
    head, tail = ev.losses[:5], ev.losses[-5:]
    return (sum(tail) / len(tail)) / (sum(head) / len(head))


def _check_healthy(ev: Evidence) -> list[str]:
    problems = []
    drop = _loss_drop(ev)
    if not drop <= LOSS_DROP:
        problems.append(f"loss does not fall enough: last/first = {drop:.3f} > {LOSS_DROP}")
    early = [r for r in ev.total_update_ratio[:10] if math.isfinite(r)]
    if early and statistics.median(early) < HEALTHY_RATIO:
        problems.append(f"median update ratio over the first steps {statistics.median(early):.2e} < {HEALTHY_RATIO}")
    never = [m for m, ch in ev.changed.items() if not any(ch)]
    if never:
        problems.append(f"trainable modules never updated: {never}")
    return problems


def _check_dead(ev: Evidence, roots: frozenset[str] | None, onset: tuple[int, int] | None) -> list[str]:
    series = dead_series(ev, roots, relu_only=roots is None)
    if not series:
        return [f"dead_neurons: no dead-unit measurement at root layers {sorted(roots or [])}"]
    step = first_dead_step(ev, series)
    if step is None:
        best = max(max(v[: ev.horizon], default=0.0) for v in series.values())
        return [f"dead_neurons: no root layer reaches {DEAD_FRACTION:.0%} dead units (max {best:.0%})"]
    if not _in(step, onset):
        return [f"dead_neurons: root layer first >= {DEAD_FRACTION:.0%} dead at step {step}, outside {onset}"]
    after = [max(v[t] for v in series.values()) for t in range(step, ev.horizon)]
    kept = sum(f >= DEAD_FRACTION for f in after) / max(1, len(after))
    if kept < 0.8:
        return [f"dead_neurons: the root layer recovers ({kept:.0%} of the later steps dead)"]
    return []


def _check_saturated(ev: Evidence, roots: frozenset[str] | None, onset: tuple[int, int] | None) -> list[str]:
    first = first_saturated(ev, hidden_saturation(ev))
    if first is None:
        return [f"saturated_activations: no hidden tanh/sigmoid reaches {SATURATED_FRACTION:.0%} saturation"]
    step, key = first
    problems = []
    if not _in(step, onset):
        problems.append(f"saturated_activations: first saturated at step {step}, outside {onset}")
    if roots is not None and _module(key) not in roots:
        problems.append(f"saturated_activations: the first saturated activation is {key!r}, not in {sorted(roots)}")
    return problems


def root_ratios(ev: Evidence, roots: frozenset[str]) -> dict[str, list[float]]:
    """Per root module and step: its gradient norm over the last parametrised module's (in forward order)."""
    last = [m for m in ev.param_modules if m in ev.order][-1]
    return {
        r: [a / b if b > 0 else math.nan for a, b in zip(ev.grad_norm[r], ev.grad_norm[last], strict=True)]
        for r in roots
        if r in ev.grad_norm
    }


def root_vanishing_step(ev: Evidence, roots: frozenset[str]) -> int | None:
    """First step from which a root module's gradient stays below the ratio (at 80 % of the later steps): a
    branch cut off while the gradient reaches the modules before it around it."""
    for ratios in root_ratios(ev, roots).values():
        flags = [x < VANISHING_RATIO for x in ratios[: ev.horizon]]
        step = _first(flags)
        if step is not None and sum(flags[step:]) >= 0.8 * (len(flags) - step):
            return step
    return None


def _check_vanishing(ev: Evidence, roots: frozenset[str] | None, onset: tuple[int, int] | None) -> list[str]:
    step = first_vanishing_step(ev)
    if step is None and roots is not None:
        step = root_vanishing_step(ev, roots)
    if step is None:
        low = min((r for r in depth_ratio(ev)[: ev.horizon] if math.isfinite(r)), default=math.nan)
        return [f"vanishing_gradients: first/last gradient-norm ratio never below {VANISHING_RATIO} (min {low:.2e})"]
    if not _in(step, onset):
        return [f"vanishing_gradients: first vanishing step {step} outside {onset}"]
    if roots is not None:
        last = [m for m in ev.param_modules if m in ev.order][-1]
        ratios = {r: ev.grad_norm[r][step] / ev.grad_norm[last][step] for r in roots if r in ev.grad_norm}
        if not any(v < VANISHING_RATIO for v in ratios.values()):
            return [
                f"vanishing_gradients: no root layer's gradient is below {VANISHING_RATIO} x {last!r}'s "
                f"at step {step}: {ratios}"
            ]
    return []


def _check_exploding(ev: Evidence, roots: frozenset[str] | None, onset: tuple[int, int] | None) -> list[str]:
    step = first_exploding_step(ev)
    if step is None:
        return [f"exploding_gradients: total gradient norm never above {EXPLODING_NORM:g}"]
    problems = []
    if not _in(step, onset):
        problems.append(f"exploding_gradients: first exploding step {step} outside {onset}")
    if roots is not None and ev.init_gain:
        worst = max(ev.init_gain, key=lambda m: ev.init_gain[m])
        if worst not in roots:
            problems.append(f"exploding_gradients: the largest initial gain is {worst!r}, not a root {sorted(roots)}")
    return problems


def _check_nonfinite(ev: Evidence, roots: frozenset[str] | None, onset: tuple[int, int] | None) -> list[str]:
    if ev.nonfinite_step is None:
        return ["non_finite: every value stays finite"]
    problems = []
    if not _in(ev.nonfinite_step, onset):
        problems.append(f"non_finite: first non-finite step {ev.nonfinite_step} outside {onset}")
    if roots is not None and ev.nonfinite_origin not in roots:
        problems.append(
            f"non_finite: first non-finite value at {ev.nonfinite_origin!r} ({ev.nonfinite_source}), "
            f"not in {sorted(roots)}"
        )
    return problems


def _check_frozen(ev: Evidence, roots: frozenset[str] | None, onset: tuple[int, int] | None) -> list[str]:
    frozen = frozen_modules(ev)
    if roots is None:
        return [] if any(_in(s, onset) for s in frozen.values()) else [f"frozen_parameters: none frozen in {onset}"]
    owners = [r for r in roots if r in ev.changed]
    if not owners:
        return [f"frozen_parameters: no root layer {sorted(roots)} has trainable parameters"]
    problems = [f"frozen_parameters: {r!r} is updated" for r in owners if r not in frozen]
    problems += [
        f"frozen_parameters: {r!r} frozen from step {frozen[r]}, outside {onset}"
        for r in owners
        if r in frozen and not _in(frozen[r], onset)
    ]
    others = sorted(set(frozen) - set(roots))
    if others and len(others) == len(ev.changed) - len(owners):
        problems.append(f"frozen_parameters: every other module is frozen too: {others}")
    return problems


def _check_stalled(ev: Evidence, onset: tuple[int, int] | None) -> list[str]:
    step = first_stalled_step(ev)
    if step is None:
        low = min((r for r in ev.total_update_ratio if math.isfinite(r)), default=math.nan)
        return [
            f"stalled_updates: update ratio never below {STALLED_RATIO} for {STALL_WINDOW} steps in a row "
            f"(min {low:.2e})"
        ]
    if not _in(step, onset):
        return [f"stalled_updates: stalled from step {step}, outside {onset}"]
    return []


def _check_not_zeroed(ev: Evidence, onset: tuple[int, int] | None) -> list[str]:
    steps = [k for k, n in enumerate(ev.carried[: ev.horizon]) if n > 0]
    if not steps:
        return ["gradients_not_zeroed: no backward pass starts from the gradient the optimizer already applied"]
    problems = []
    if not _in(steps[0], onset):
        problems.append(f"gradients_not_zeroed: first carried-over gradient at step {steps[0]}, outside {onset}")
    span = ev.horizon - steps[0]
    if len(steps) < max(2, span // 2):
        problems.append(
            f"gradients_not_zeroed: gradients carried over at only {len(steps)} of the {span} steps from {steps[0]}"
        )
    return problems


def check(scenario: Scenario, ev: Evidence) -> list[str]:
    """Contradictions between the evidence and the scenario's ground truth (empty when consistent)."""
    t = scenario.truth
    problems: list[str] = []
    seen = symptoms(ev)
    allowed = t.kinds | t.may_also
    problems += [
        f"unexpected {kind} from step {step} (not in kinds or may_also)"
        for kind, step in sorted(seen.items())
        if kind not in allowed
    ]
    if t.healthy:
        return problems + _check_healthy(ev) + extra_evidence(scenario, ev)[1]
    roots, onset = t.root_layers, t.onset
    checkers = {
        "dead_neurons": lambda: _check_dead(ev, roots, onset),
        "saturated_activations": lambda: _check_saturated(ev, roots, onset),
        "vanishing_gradients": lambda: _check_vanishing(ev, roots, onset),
        "exploding_gradients": lambda: _check_exploding(ev, roots, onset),
        "non_finite": lambda: _check_nonfinite(ev, roots, onset),
        "frozen_parameters": lambda: _check_frozen(ev, roots, onset),
        "stalled_updates": lambda: _check_stalled(ev, onset),
        "gradients_not_zeroed": lambda: _check_not_zeroed(ev, onset),
    }
    for kind in sorted(t.kinds):
        problems += checkers[kind]()
    return problems + extra_evidence(scenario, ev)[1]


# ------------------------------------------------------------------------------------- scenario-specific checks
#
# What a generic definition cannot see: that a summed loss's large gradients are only its scale (a mean twin),
# that a small gradient is cancelled by construction (perturbing the parameters changes nothing), that attention
# starts uniform, that a gate stays shut. Each check may train control runs; results are kept per evidence.

Lines = list[str]
Problems = list[str]
Extra = Callable[[Scenario, Evidence], tuple[Lines, Problems]]
EXTRAS: dict[str, Extra] = {}
_EXTRA_CACHE: dict[tuple[str, int], tuple[Evidence, tuple[Lines, Problems]]] = {}


def extra(name: str) -> Callable[[Extra], Extra]:
    def register(fn: Extra) -> Extra:
        get(name)  # a KeyError for a misspelt scenario
        EXTRAS[name] = fn
        return fn

    return register


def extra_evidence(scenario: Scenario, ev: Evidence) -> tuple[Lines, Problems]:
    """(evidence lines, contradictions) of the scenario's own checks; empty when it has none."""
    fn = EXTRAS.get(scenario.name)
    if fn is None:
        return [], []
    key = (scenario.name, id(ev))
    cached = _EXTRA_CACHE.get(key)
    if cached is None or cached[0] is not ev:
        cached = (ev, fn(scenario, ev))
        _EXTRA_CACHE[key] = cached
    return cached[1]


def trained(run: Run) -> tuple[nn.Module, list[float]]:
    """Train ``run`` without hooks; returns the model and the total gradient norm of each step."""
    norms: list[float] = []

    def probe(step: int, model: nn.Module, loss: torch.Tensor) -> None:
        norms.append(_norm(p.grad for p in model.parameters() if p.grad is not None))

    run.train(probe)
    return run.model, norms


def _mean_twin(scenario: Scenario, ev: Evidence, lr_factor: float) -> tuple[Lines, Problems]:
    """The same run with the summed loss divided by its element count n must follow the same weights (apart by
    less than 1 % of the distance they travelled): for SGD with the learning rate multiplied by ``lr_factor`` (n),
    for Adam unchanged but for its epsilon, divided by n too (the only term of Adam's update that is not
    scale-invariant)."""
    start = scenario.build().model
    summed, _ = trained(scenario.build())
    twin = scenario.build()
    n = twin.batch(0)[1].numel()
    loss_fn = twin.loss_fn
    twin.loss_fn = lambda out, target: loss_fn(out, target) / n
    for opt in twin.optimizers:
        for group in opt.param_groups:
            group["lr"] *= lr_factor
            if "eps" in group:
                group["eps"] /= n
    mean_model, mean_norms = trained(twin)
    params = list(summed.parameters())
    apart = _norm(a.detach() - b.detach() for a, b in zip(params, mean_model.parameters(), strict=True))
    travelled = _norm(a.detach() - b.detach() for a, b in zip(params, start.parameters(), strict=True))
    lines = [
        f"   summed loss: total gradient norm up to {max(ev.total_grad_norm):.3g}; loss gradient from "
        f"{ev.loss_grad[0]:.3g}; mean twin (loss / {n}, lr x {lr_factor:g}, eps / {n}): gradient norm up to "
        f"{max(mean_norms):.3g}; final weights apart by {apart / travelled:.1e} of the distance travelled"
    ]
    problems = []
    if max(ev.total_grad_norm) <= EXPLODING_NORM:
        problems.append("the summed loss's gradients never exceed 1e3: the scenario tests nothing")
    if apart > 0.01 * travelled:
        problems.append(f"the mean twin ends {apart / travelled:.1e} of the way apart: more than the loss's scale")
    return lines, problems


@extra("healthy_vae_summed_loss_adam")
def _(s: Scenario, ev: Evidence) -> tuple[Lines, Problems]:
    return _mean_twin(s, ev, lr_factor=1.0)


@extra("healthy_summed_loss_sgd_scaled_lr")
def _(s: Scenario, ev: Evidence) -> tuple[Lines, Problems]:
    return _mean_twin(s, ev, lr_factor=float(s.build().batch(0)[1].numel()))


@extra("exploding_summed_loss_sgd_lr_too_high")
def _(s: Scenario, ev: Evidence) -> tuple[Lines, Problems]:
    def scaled_lr(run: Run) -> Run:
        for group in run.optimizers[0].param_groups:
            group["lr"] /= run.batch(0)[1].numel()
        return run

    ctl = measure(dataclasses.replace(s, build=lambda: scaled_lr(s.build())))
    finite = [x for x in ev.losses if math.isfinite(x)]
    lines = [
        f"   loss {finite[0]:.3g} -> up to {max(finite):.3g} before NaN; update/weight ratio at step 0 "
        f"{ev.total_update_ratio[0]:.2g}; control at lr / batch: symptoms {symptoms(ctl)}, loss drop "
        f"{_loss_drop(ctl):.2f}"
    ]
    problems = []
    if max(finite) < 100 * finite[0] or ev.total_update_ratio[0] < 0.5:
        problems.append("the run does not diverge with updates as large as the weights")
    if symptoms(ctl) or _loss_drop(ctl) > LOSS_DROP:
        problems.append("the control at a scaled learning rate is not healthy")
    return lines, problems


def _attention_probs(model: nn.Module, inputs: torch.Tensor, module: str) -> torch.Tensor:
    """The attention probabilities of ``module`` (the dropout applied to them) on ``inputs``."""
    seen: list[torch.Tensor] = []
    handle = dict(model.named_modules())[module].register_forward_hook(lambda m, a, out: seen.append(out.detach()))
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        handle.remove()
    return seen[0]


@extra("healthy_tiny_bert_adamw")
def _(s: Scenario, ev: Evidence) -> tuple[Lines, Problems]:
    run = s.build()
    probs = _attention_probs(run.model, run.batch(0)[0], "layers.0.attention.dropout")
    peak = float(probs.amax(dim=-1).mean())
    ratios = root_ratios(ev, frozenset({"layers.0.attention.query", "layers.0.attention.key"}))
    first = max(r[0] for r in ratios.values())
    last = min(r[-1] for r in ratios.values())
    lines = [
        f"   attention at step 0: mean largest probability {peak:.3f} (uniform: {1 / probs.shape[-1]:.3f}); "
        f"layer 0 query/key gradient / classifier's: {first:.1e} at step 0, {last:.1e} at the end"
    ]
    problems = []
    if peak > 2 / probs.shape[-1]:
        problems.append("attention is not near-uniform at initialisation")
    if first >= VANISHING_RATIO:
        problems.append("the query/key gradients do not start small: the scenario tests nothing")
    if last < 30 * first:
        problems.append("the query/key gradients do not grow with training")
    return lines, problems


@extra("vanishing_attention_gate_stuck_closed")
def _(s: Scenario, ev: Evidence) -> tuple[Lines, Problems]:
    from benchmarks.scenarios.attention import GATED_BRANCH

    ratios = root_ratios(ev, GATED_BRANCH)
    worst = max(max(r[: ev.horizon]) for r in ratios.values())
    opened: list[float] = []
    run = s.build()
    gate = run.model.layers[0].gate
    handle = gate.register_forward_hook(lambda m, a, out: opened.append(float(torch.sigmoid(out.detach()).max())))
    run.train()
    handle.remove()

    def open_gate(run: Run) -> Run:
        nn.init.zeros_(run.model.layers[0].gate.bias)
        return run

    ctl = measure(dataclasses.replace(s, build=lambda: open_gate(s.build())))
    ctl_ratios = root_ratios(ctl, GATED_BRANCH)
    gain = min(ctl_ratios[layer][0] / ratios[layer][0] for layer in GATED_BRANCH)
    lines = [
        f"   gated branch gradient / classifier's: at most {worst:.1e} over the run; the gate opens at most "
        f"{max(opened):.1e}; with the gate bias at 0 every layer of the branch starts with >= {gain:.0f}x more"
    ]
    problems = []
    if worst >= VANISHING_RATIO / 10:
        problems.append(f"the gated branch's gradient reaches {worst:.1e} of the classifier's")
    if max(opened) >= 1e-4:
        problems.append(f"the gate opens to {max(opened):.1e}")
    if gain < 1e3:
        problems.append("opening the gate does not restore the branch's gradients")
    return lines, problems


def _cancelled_norm(s: Scenario, ev: Evidence, norm: str) -> tuple[Lines, Problems]:
    """The first of two normalisations in a row: its gradient is ~0 and perturbing it changes nothing."""
    run = s.build()
    x, _ = run.batch(0)
    module = dict(run.model.named_modules())[norm]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        before = run.model(x)
        module.weight.mul_(torch.exp(0.3 * torch.randn(module.weight.shape, generator=g)))
        module.bias.add_(0.3 * torch.randn(module.bias.shape, generator=g))
        after = run.model(x)
    moved = float((after - before).norm() / before.norm())
    ratio = max(r for r in root_ratios(ev, frozenset({norm}))[norm] if math.isfinite(r))
    lines = [
        f"   {norm!r}: gradient at most {ratio:.1e} of the last layer's; scaling its weight by random positive factors "
        f"and shifting its bias moves the output by {moved:.1e} (relative)"
    ]
    problems = []
    if moved > 1e-4:
        problems.append(f"{norm!r} is not cancelled by the normalisation after it (output moves {moved:.1e})")
    if ratio >= VANISHING_RATIO:
        problems.append(f"{norm!r}'s gradient is not small: the scenario tests nothing")
    return lines, problems


@extra("healthy_layernorm_then_batchnorm")
def _(s: Scenario, ev: Evidence) -> tuple[Lines, Problems]:
    return _cancelled_norm(s, ev, "1")


@extra("healthy_conv_batchnorm_twice")
def _(s: Scenario, ev: Evidence) -> tuple[Lines, Problems]:
    return _cancelled_norm(s, ev, "bn_a")


def _zero_grad_twin(s: Scenario, ev: Evidence) -> tuple[Lines, Problems]:
    """The same run with the default loop (optimizer.zero_grad() before every backward pass) must be healthy and
    end clearly better: the missing zero_grad is what harms."""
    ctl = measure(dataclasses.replace(s, build=lambda: dataclasses.replace(s.build(), loop=None)))
    fault, healthy = _loss_drop(ev), _loss_drop(ctl)
    lines = [
        f"   parameters carried over per step: {' '.join(str(n) for n in ev.carried[:8])} ... (of "
        f"{len(ev.param_grad_norm)}); loss last/first {fault:.3g}; twin with zero_grad(): symptoms {symptoms(ctl)}, "
        f"loss last/first {healthy:.3g}, never carried: {not any(ctl.carried)}"
    ]
    problems = []
    if symptoms(ctl) or healthy > LOSS_DROP or any(ctl.carried):
        problems.append("the twin with zero_grad() in the loop is not healthy")
    if not fault > 3 * healthy:
        problems.append(f"the missing zero_grad does not harm (loss last/first {fault:.3g} vs {healthy:.3g})")
    return lines, problems


@extra("zerograd_missing_mlp_sgd")
def _(s: Scenario, ev: Evidence) -> tuple[Lines, Problems]:
    return _zero_grad_twin(s, ev)


@extra("zerograd_missing_cnn_sgd_momentum")
def _(s: Scenario, ev: Evidence) -> tuple[Lines, Problems]:
    return _zero_grad_twin(s, ev)


# ------------------------------------------------------------------------------------------------- printing


def _fmt(values: list[float], window: slice) -> str:
    return " ".join(f"{v:.2g}" for v in values[window])


def _window(t: GroundTruth) -> slice:
    """Steps worth printing: the first ones, or from just before a mid-run onset."""
    first = max(0, t.onset[0] - 2) if t.onset else 0
    return slice(first, first + 8)


def report(scenario: Scenario, ev: Evidence) -> list[str]:
    """Human-readable evidence lines for one scenario."""
    t = scenario.truth
    w = _window(t)
    roots = "None" if t.root_layers is None else sorted(t.root_layers)
    lines = [
        f"== {scenario.name} [{scenario.arch}] kinds={sorted(t.kinds) or 'healthy'} "
        f"may_also={sorted(t.may_also)} roots={roots} onset={t.onset}",
        f"   {scenario.description}",
        f"   loss {ev.losses[0]:.4g} -> {ev.losses[-1]:.4g} over {ev.steps} steps (last/first over 5 steps "
        f"{_loss_drop(ev):.2f}); train+probe {ev.probed_seconds:.2f}s",
        f"   symptoms (kind: first step): {symptoms(ev)}",
        f"   printed window: steps {w.start}..{w.stop - 1}; loss {_fmt(ev.losses, w)}",
    ]
    if ev.nonfinite_step is not None:
        lines.append(
            f"   first non-finite: step {ev.nonfinite_step} at {ev.nonfinite_origin!r} ({ev.nonfinite_source})"
        )
    grad_line = f"   total grad norm: {_fmt(ev.total_grad_norm, w)}"
    if ev.horizon > 0:
        last = ev.horizon - 1
        grad_line += (
            f"; at the last finite step {last}: {ev.total_grad_norm[last]:.2g} "
            f"(update ratio {ev.total_update_ratio[last]:.2g})"
        )
    lines.append(grad_line)
    called = [m for m in ev.param_modules if m in ev.order]
    focus = set(t.root_layers or []) | ({called[0], called[-1]} if called else set())
    for m in [m for m in ev.param_modules if m in focus]:
        lines.append(
            f"   {m!r}: grad norm {_fmt(ev.grad_norm[m], w)}; update ratio {_fmt(ev.update_ratio[m], w)}; "
            f"changed at {sum(ev.changed[m])}/{len(ev.changed[m])} steps"
        )
    lines += _activation_lines(ev, t, w)
    scales = loss_scale(ev)
    if max(scales, default=1.0) > 1:
        lines.append(f"   loss gradient scale (exploding threshold x): {_fmt(scales, w)}")
    lines += extra_evidence(scenario, ev)[0]
    smallest = _smallest_gradients(ev)
    if smallest:
        lines.append(f"   smallest parameter gradients (median over finite steps): {smallest}")
    early = [r for r in ev.total_update_ratio[:10] if math.isfinite(r)]
    if early:
        lines.append(f"   median update/weight ratio, first 10 steps: {statistics.median(early):.2e}")
    if ev.frozen_by_design:
        lines.append(f"   frozen by design (requires_grad=False): {ev.frozen_by_design}")
    frozen = frozen_modules(ev)
    if frozen:
        lines.append(f"   unchanged by the optimizer (module: from step): {frozen}")
    return lines


def _smallest_gradients(ev: Evidence, n: int = 3) -> str:
    medians = {}
    for name, norms in ev.param_grad_norm.items():
        finite = [g for g in norms[: ev.horizon] if math.isfinite(g)]
        if finite:
            medians[name] = statistics.median(finite)
    return ", ".join(f"{k}={v:.1e}" for k, v in sorted(medians.items(), key=lambda kv: kv[1])[:n])


def _activation_lines(ev: Evidence, t: GroundTruth, w: slice) -> list[str]:
    lines = []
    for key, values in ev.dead.items():
        if ev.kinds_of.get(key) == "ReLU" or _module(key) in (t.root_layers or ()):
            zeros = ev.zeros.get(key)
            sparsity = f"; zero elements at step 0: {zeros[0]:.0%}" if zeros else ""
            lines.append(
                f"   dead units {key!r} ({ev.kinds_of.get(key)}): {_fmt(values, w)}; "
                f"max before non-finite {max(values[: ev.horizon] or [0]):.0%}{sparsity}"
            )
    for key, values in ev.saturated.items():
        tag = " (model output)" if key in ev.output_keys else ""
        lines.append(
            f"   saturated {key!r}{tag}: {_fmt(values, w)}; at the last finite step {values[ev.horizon - 1]:.0%}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="scenario names (all when omitted)")
    parser.add_argument("--timing", action="store_true", help="also time each scenario's training without probes")
    args = parser.parse_args(argv)
    scenarios = [get(n) for n in args.names] if args.names else SCENARIOS
    failures = 0
    for scenario in scenarios:
        ev = measure(scenario)
        for line in report(scenario, ev):
            print(line)
        if args.timing:
            print(f"   plain training time: {train_seconds(scenario):.2f}s")
        problems = check(scenario, ev)
        failures += bool(problems)
        for p in problems:
            print(f"   CONTRADICTION: {p}")
        print(f"   -> {'OK' if not problems else 'INCONSISTENT'}")
    print(f"{len(scenarios) - failures}/{len(scenarios)} scenarios consistent with their ground truth")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
