"""The small contract every detector implements, and the per-step view they read.

A detector turns one step's statistics into :class:`Finding` s ("layer '3' is dead at this step, 100 % of 64
units"), and says which layers it *observed* at that step, so a state that stops holding closes its event. The
tracker (:mod:`neuraldbg.analysis.tracker`) applies persistence and merges consecutive steps into events; detectors
stay pure functions of one step (plus, where they need it, a little state of their own, such as a baseline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from ..config import DebugConfig
from ..events import EventType, FailureKind
from ..model.layers import LayerInfo
from ..stats.step import SlotKey, StepData

#: What the tracker follows over time: (detector, event type, layer, param, call).
TrackKey = tuple[str, EventType, str, "str | None", int]


@dataclass(frozen=True)
class Finding:
    """One abnormal state of one layer (or parameter) at one step."""

    event_type: EventType
    kind: FailureKind | None
    layer: str
    state: str
    metrics: dict[str, float]
    strength: float  # 0 at the threshold, 1 far beyond it
    param: str | None = None
    call: int = 0
    decisive: bool = False  # no persistence needed (e.g. a NaN)
    provisional: bool = False  # past an onset threshold only: dates the run but does not confirm it


@dataclass
class Observation:
    """What a detector saw at one step: the keys it looked at, and the abnormal ones among them."""

    observed: list[tuple[EventType, str, str | None, int]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def saw(self, event_type: EventType, layer: str, param: str | None = None, call: int = 0) -> None:
        """Record that ``layer`` (or ``param``) was looked at, abnormal or not."""
        self.observed.append((event_type, layer, param, call))


@dataclass
class Context:
    """What detectors know about the model besides one step's numbers."""

    config: DebugConfig
    infos: dict[str, LayerInfo]
    order: list[SlotKey]  # forward execution order of layer outputs (grows as layers are first seen)
    owners: dict[str, str]  # parameter -> owning layer

    _index: dict[SlotKey, int] = field(default_factory=dict, repr=False)
    _last_parametric: int = -1

    def _refresh(self) -> None:
        if len(self._index) != len(self.order):
            self._index = {key: i for i, key in enumerate(self.order)}
            positions = [i for i, (layer, _) in enumerate(self.order) if self.infos[layer].numel > 0]
            self._last_parametric = max(positions, default=-1)

    def position(self, key: SlotKey) -> int:
        self._refresh()
        return self._index.get(key, len(self.order))

    def next_output(self, layer: str) -> str | None:
        """The layer whose output follows ``layer``'s first output in forward order, skipping the containers that
        hold ``layer`` (a container's output is its last child's, and comes right after it)."""
        self._refresh()
        pos = self._index.get((layer, 0))
        if pos is None:
            return None
        for name, _ in self.order[pos + 1 :]:
            if not (name == "" or layer.startswith(name + ".")):
                return name
        return None

    def is_hidden(self, key: SlotKey) -> bool:
        """A layer output that feeds later parametric layers (not the model's final activation)."""
        self._refresh()
        pos = self._index.get(key)
        return pos is not None and pos < self._last_parametric


@dataclass(frozen=True)
class LayerGradient:
    norm: float  # L2 norm over the layer's parameters that got a gradient
    numel: int
    exact_zero: bool  # every element is exactly 0
    non_finite: bool  # some element is inf or NaN


@dataclass(frozen=True)
class LayerUpdate:
    delta: float  # ||W_after - W_before|| over the layer's parameters
    weight: float  # ||W_after||

    @property
    def ratio(self) -> float:
        return self.delta / self.weight if self.weight > 0 else (0.0 if self.delta == 0 else math.inf)


class StepView:
    """One step's statistics with per-layer aggregates computed once and shared by all detectors."""

    def __init__(self, data: StepData, ctx: Context) -> None:
        self.data = data
        self.ctx = ctx

    @property
    def step(self) -> int:
        return self.data.step

    @cached_property
    def layer_gradients(self) -> dict[str, LayerGradient]:
        sums: dict[str, list[float]] = {}
        for name, norm in self.data.grad.items():
            layer = self.ctx.owners.get(name)
            if layer is None:
                continue
            acc = sums.setdefault(layer, [0.0, 0.0, 1.0, 0.0])  # sum of squares, numel, all zero, non-finite
            acc[0] += norm * norm
            acc[1] += self.data.grad_numel.get(name, 0)
            if name not in self.data.grad_exact_zero:
                acc[2] = 0.0
            if name in self.data.grad_nonfinite or not math.isfinite(norm):
                acc[3] = 1.0
        return {layer: LayerGradient(math.sqrt(s), int(n), bool(z), bool(nf)) for layer, (s, n, z, nf) in sums.items()}

    @cached_property
    def layer_updates(self) -> dict[str, LayerUpdate]:
        sums: dict[str, list[float]] = {}
        for name, (delta, weight) in self.data.update.items():
            layer = self.ctx.owners.get(name)
            if layer is None:
                continue
            acc = sums.setdefault(layer, [0.0, 0.0])
            acc[0] += delta * delta
            acc[1] += weight * weight
        return {layer: LayerUpdate(math.sqrt(d), math.sqrt(w)) for layer, (d, w) in sums.items()}

    def rms(self, key: SlotKey) -> float:
        norm = self.data.act.get(key)
        n = self.data.numel.get(key, 0)
        if norm is None or n == 0:
            return math.nan
        return norm / math.sqrt(n)


class FitProgress:
    """How far the fit has come, for detectors that must not mistake convergence for a fault.

    A fit that has converged has little left to learn: its gradients and updates shrink with the loss, and small
    ones are then the fit, not vanishing gradients or a stalled learning rate. It has converged at a step when the
    loss's gradient w.r.t. the model's output (always measured) is at most ``fit_gradient_drop`` of its first
    value, or the loss (when the loop reports it with ``observe_loss``) is at most ``fit_loss_drop`` of its
    first value. Judged at each step from that step's readings: a fit that diverges again is no longer
    converged. The first values are the first finite (and, for the loss, positive) readings: a loss that starts
    at or below 0 (a log-likelihood, a GAN's) is never compared.
    """

    def __init__(self) -> None:
        self._first_gradient: float | None = None
        self._first_loss: float | None = None

    def converged(self, view: StepView) -> bool:
        """Whether the fit has converged at ``view``'s step (also records the first readings)."""
        cfg = view.ctx.config
        tg, loss = view.data.target_grad, view.data.loss
        done = False
        if tg is not None and math.isfinite(tg) and tg >= 0:
            if self._first_gradient is None and tg > 0:
                self._first_gradient = tg
            done = self._first_gradient is not None and tg <= cfg.fit_gradient_drop * self._first_gradient
        if loss is not None and math.isfinite(loss) and loss >= 0:
            if self._first_loss is None and loss > 0:
                self._first_loss = loss
            done = done or (self._first_loss is not None and loss <= cfg.fit_loss_drop * self._first_loss)
        return done


class Detector:
    """Base class: subclasses set ``name`` and ``event_type`` and implement :meth:`observe`."""

    name: str = "detector"
    event_type: EventType = EventType.ACTIVATION
    #: Whether it reads cheap (not fully observed) steps. False skips it on them: they carry no gradient,
    #: per-unit or update statistics. Plugins keep the default and see every step.
    every_step: bool = True

    def observe(self, view: StepView) -> Observation | None:
        """Findings at one step, or None when this step carries nothing this detector reads."""
        raise NotImplementedError


def strength(value: float, threshold: float, decades: float = 3.0, above: bool = False) -> float:
    """How far ``value`` is past ``threshold`` on a log scale: 0 at the threshold, 1 at ``decades`` beyond."""
    if not math.isfinite(value) or threshold <= 0:
        return 1.0
    if above:
        ratio = value / threshold
    elif value <= 0:
        return 1.0
    else:
        ratio = threshold / value
    return max(0.0, min(1.0, math.log10(ratio) / decades)) if ratio > 1 else 0.0
