"""The small contract every detector implements, and the per-step view they read.

A detector turns one step's statistics into :class:`Finding` s ("layer '3' is dead at this step, 100 % of 64
units"), and says which layers it *observed* at that step, so a state that stops holding closes its event. The
tracker (:mod:`neuraldbg.analysis.tracker`) applies persistence and merges consecutive steps into events; detectors
stay pure functions of one step (plus, where they need it, a little state of their own, such as a baseline).

Each detector belongs to the room of the kind it finds (:mod:`neuraldbg.kinds`); what several detectors share
(per-layer gradients and updates, what the optimizer did this step, how far the fit has come) is computed once per
step here. Nothing here imports torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from ..config import DebugConfig
from ..events import EventType, FailureKind
from ..health import HealthState
from ..model.info import LayerInfo, Role
from ..stats.step import SlotKey, StepData

#: What the tracker follows over time: (track, event type, layer, param, call). Detectors of one track classify one
#: signal (a layer's gradient is healthy, vanishing, exploding or non-finite): one state at a time per key. The event
#: type is an ``EventType`` (from a finding) or its plain string (from an observed key, see :data:`PLAIN_TYPES`):
#: the two are equal and hash alike, so both name the same key.
TrackKey = tuple[str, str, str, "str | None", int]


@dataclass(frozen=True)
class Finding:
    """One abnormal state of one layer (or parameter) at one step."""

    event_type: EventType
    kind: FailureKind | None
    layer: str
    state: HealthState
    metrics: dict[str, float]
    strength: float  # 0 at the threshold, 1 far beyond it
    param: str | None = None
    call: int = 0
    decisive: bool = False  # no persistence needed (e.g. a NaN)
    provisional: bool = False  # past an onset threshold only: dates the run but does not confirm it
    # what the run it opens or extends has done, seen over its own steps, proves it real however few of them were
    # solid: its earlier provisional observations waited for this evidence (a surge of updates over which the loss
    # rose: see :mod:`neuraldbg.kinds.oversized_updates`)
    confirms_run: bool = False


#: Each event type as its plain string, the form an observed key holds it in (:meth:`Observation.saw`). A detector
#: of a deep model records thousands of keys per step, alive until the tracker has read them: a tuple of strings and
#: ints is one the garbage collector stops following at its first collection, where one holding an enum member is
#: followed, and promoted to the oldest generation, whose growth sets off full collections of the whole process.
#: ``EventType`` is a ``str`` enum: a member and its string are equal and hash alike, so either finds the same key.
PLAIN_TYPES: dict[str, str] = {t: t.value for t in EventType}

#: What :meth:`Observation.saw` records: (event type, as its plain string; layer; parameter; call).
ObservedKey = tuple[str, str, "str | None", int]


@dataclass
class Observation:
    """What a detector saw at one step: the keys it looked at, and the abnormal ones among them."""

    observed: list[ObservedKey] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def saw(self, event_type: EventType | str, layer: str, param: str | None = None, call: int = 0) -> None:
        """Record that ``layer`` (or ``param``) was looked at, abnormal or not."""
        self.observed.append((PLAIN_TYPES.get(event_type, event_type), layer, param, call))

    def saw_each(self, event_type: EventType | str, layers: Iterable[str]) -> None:
        """Record that each of ``layers`` was looked at (their first calls), in order: :meth:`saw` for many."""
        self.saw_params(event_type, [(layer, None) for layer in layers])

    def saw_params(self, event_type: EventType | str, keys: Iterable[tuple[str, str | None]]) -> None:
        """Record that each ``(layer, param)`` was looked at (first calls), in order: :meth:`saw` for many."""
        plain = PLAIN_TYPES.get(event_type, event_type)
        self.observed.extend([(plain, layer, param, 0) for layer, param in keys])


@dataclass
class Context:
    """What detectors know about the model besides one step's numbers."""

    config: DebugConfig
    infos: dict[str, LayerInfo]
    order: list[SlotKey]  # forward execution order of layer outputs (grows as layers are first seen)
    owners: dict[str, str]  # parameter -> owning layer
    stepped_before: set[str] = field(default_factory=set)  # parameters some optimizer stepped at an observed step

    _index: dict[SlotKey, int] = field(default_factory=dict, repr=False)
    _last_parametric: int = -1
    # at each position of ``order`` (and one past it), the nearest layer with parameters before it
    _fed_by: list[str | None] = field(default_factory=list, repr=False)
    _holders: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)

    def _refresh(self) -> None:
        if len(self._index) != len(self.order) or len(self._fed_by) != len(self.order) + 1:
            self._index = {key: i for i, key in enumerate(self.order)}
            positions = [i for i, (layer, _) in enumerate(self.order) if self.infos[layer].numel > 0]
            self._last_parametric = max(positions, default=-1)
            fed_by: list[str | None] = []
            last = None
            for layer, _ in self.order:
                fed_by.append(last)
                info = self.infos.get(layer)
                if info is not None and info.role is Role.PARAMETRIC:
                    last = layer
            self._fed_by = [*fed_by, last]

    def position(self, key: SlotKey) -> int:
        self._refresh()
        return self._index.get(key, len(self.order))

    def feeding(self, key: SlotKey) -> str | None:
        """The nearest layer with parameters before the output ``key`` in forward order: what feeds an activation
        (for a key not in the order yet, the last one). Worked out again only when the order grows."""
        pos = self.position(key)  # brings the list up to date first
        return self._fed_by[pos]

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

    def gate_holders(self, layer: str) -> tuple[str, ...]:
        """The modules that may hold a learnable gate scaling ``layer``'s branch: those enclosing it, then its
        siblings (same parent module) that own parameters and are no standard layer (no unit weight, not a
        normalisation). Worked out once per layer: the modules do not change during a run."""
        found = self._holders.get(layer)
        if found is None:
            parent = layer.rpartition(".")[0]
            enclosing = [name for name in self.infos if name and layer.startswith(name + ".")]
            beside = [
                name
                for name, info in self.infos.items()
                if name.rpartition(".")[0] == parent
                and name != layer
                and info.unit_weight is None
                and not info.normalizes
                and info.role is Role.PARAMETRIC
            ]
            found = self._holders[layer] = (*enclosing, *beside)
        return found

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
    before: float = math.nan  # ||W_before||, when it was read

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
    def layer_norms_before_clip(self) -> dict[str, float]:
        """Each layer's gradient norm as the backward pass left it, before clipping shrank it (empty when nothing
        was clipped at this step)."""
        before = self.data.grad_before_clip
        if not before:
            return {}
        sums: dict[str, float] = {}
        for name, norm in self.data.grad.items():
            layer = self.ctx.owners.get(name)
            if layer is not None:
                value = before.get(name, norm)
                sums[layer] = sums.get(layer, 0.0) + value * value
        return {layer: math.sqrt(s) for layer, s in sums.items()}

    @cached_property
    def layer_updates(self) -> dict[str, LayerUpdate]:
        sums: dict[str, list[float]] = {}
        before = self.data.update_before
        for name, (delta, weight) in self.data.update.items():
            layer = self.ctx.owners.get(name)
            if layer is None:
                continue
            acc = sums.setdefault(layer, [0.0, 0.0, 0.0])
            acc[0] += delta * delta
            acc[1] += weight * weight
            acc[2] += before.get(name, math.nan) ** 2
        return {layer: LayerUpdate(math.sqrt(d), math.sqrt(w), math.sqrt(b)) for layer, (d, w, b) in sums.items()}

    @cached_property
    def updates(self) -> UpdateCensus | None:
        """What the optimizer did to the weights at this step (None when the update was not measured)."""
        return UpdateCensus.take(self) if self.data.update else None

    def rms(self, key: SlotKey) -> float:
        norm = self.data.act.get(key)
        n = self.data.numel.get(key, 0)
        if norm is None or n == 0:
            return math.nan
        return norm / math.sqrt(n)


def _middle(ratios: list[float], layers: list[str]) -> tuple[str, ...]:
    """The layer whose ratio is the median, or the two middle ones for an even count."""
    order = sorted(range(len(ratios)), key=ratios.__getitem__)
    return tuple(layers[i] for i in order[(len(order) - 1) // 2 : len(order) // 2 + 1])


def _layer_lrs(stepped: dict[str, float], owners: dict[str, str]) -> dict[str, float]:
    """Each layer's learning rate: the largest positive one its parameters were stepped with."""
    lrs: dict[str, float] = {}
    for name, lr in stepped.items():
        layer = owners.get(name)
        if layer is not None and lr > 0 and lr > lrs.get(layer, 0.0):
            lrs[layer] = lr
    return lrs


@dataclass
class UpdateCensus:
    """What the optimizer did to the weights at one fully observed step, read once for every detector.

    A parameter that received a non-zero gradient and was left exactly unchanged is *held still*: frozen, unless
    its optimizer steps on other steps (a parameter stepped at an earlier observed step and not at this one: a GAN's
    generator while the discriminator's optimizer steps), whose layer is *idle* at this step and says nothing.
    A parameter stepped with a learning rate, too small to move it, is not held still: that is a stall. The update
    ratios ||dW||/||W|| are taken over the layers that are neither held still nor idle nor without a gradient (no
    gradient, no update: not the optimizer's fault).
    """

    seen: list[tuple[str, str]]  # (layer, parameter) whose update was read, with a finite gradient
    held: list[tuple[str, str, dict[str, float]]]  # (layer, parameter, metrics): gradient, unchanged, no lr
    moving: bool  # some parameter with a gradient changed
    stepped_ever: bool  # some optimizer stepped a parameter of the model at this or an earlier observed step
    ratios: list[float]
    layers: list[str]  # the layer of each ratio
    lr: float | None  # the largest learning rate a parameter was stepped with at this step (None: none positive)
    lr_any: float  # the largest learning rate of this step, 0 included
    # the layers whose update ratio is the median (the two middle ones for an even count) and the learning rate of
    # each layer (the largest positive one its parameters were stepped with): what moved the updates the median
    # reads, when parameter groups step at different rates (a backbone on a schedule that decays to 0 beside a head
    # at a fixed rate)
    median_layers: tuple[str, ...] = ()
    layer_lrs: dict[str, float] = field(default_factory=dict)

    @property
    def at_lr_zero(self) -> bool:
        """Nothing moved, and the optimizers hold the still parameters with learning rate 0: one global stall
        (a schedule that reached 0), not every parameter frozen."""
        return not self.moving and any(m["in_optimizer"] for _, _, m in self.held)

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @classmethod
    def take(cls, view: StepView) -> UpdateCensus:
        data, ctx = view.data, view.ctx
        seen: list[tuple[str, str]] = []
        held: list[tuple[str, str, dict[str, float]]] = []
        still_layers: set[str] = set()
        idle_layers: set[str] = set()
        for name, (delta, weight) in data.update.items():
            grad = data.grad.get(name)
            layer = ctx.owners.get(name)
            if grad is None or layer is None or not math.isfinite(grad):
                continue
            seen.append((layer, name))
            if delta == 0.0 and grad > 0.0:
                lr = data.stepped.get(name)
                if lr is not None and lr > 0:
                    continue  # stepped with a learning rate, too small to move the weight: a stall
                if lr is None and name in ctx.stepped_before:
                    idle_layers.add(layer)  # its optimizer steps on other steps
                    continue
                still_layers.add(layer)
                metrics = {"grad_norm": grad, "in_optimizer": float(lr is not None), "lr": lr or 0.0}
                info = ctx.infos.get(layer)
                if weight == 0.0 and info is not None and name == info.unit_weight:
                    metrics["zero_weight"] = 1.0  # its layer passes no gradient to its input
                held.append((layer, name, metrics))
        ctx.stepped_before.update(data.stepped)
        # ``grads`` holds the layers with a gradient at this step: one without, while others have one, was frozen
        # since the debugger was made (``requires_grad_(False)`` in a warm-up of the head, progressive freezing)
        grads = view.layer_gradients
        layers = [
            layer
            for layer, u in view.layer_updates.items()
            if layer not in still_layers
            and layer not in idle_layers
            and u.weight > 0
            and math.isfinite(u.ratio)
            and not (layer in grads and grads[layer].exact_zero)
            and (not grads or layer in grads)
        ]
        ratios = [view.layer_updates[layer].ratio for layer in layers]
        lrs = [lr for lr in data.stepped.values() if lr > 0]
        lr = max(lrs) if lrs else None
        return cls(
            seen=seen,
            held=held,
            moving=any(d != 0.0 and n in data.grad for n, (d, _) in data.update.items()),
            stepped_ever=bool(ctx.stepped_before),
            ratios=ratios,
            layers=layers,
            lr=lr,
            lr_any=max(data.stepped.values(), default=0.0),
            median_layers=_middle(ratios, layers),
            layer_lrs=_layer_lrs(data.stepped, ctx.owners),
        )

    def ratio_metrics(self) -> dict[str, float]:
        """The median and largest update ratio, and the learning rate, as an event's metrics."""
        metrics = {"median_update_ratio": self.median, "max_update_ratio": max(self.ratios)}
        if self.lr is not None:
            metrics["lr"] = self.lr
        return metrics


#: A first loss between these multiples of log(classes) is a classifier's cross-entropy at chance (see FitProgress);
#: one over the band is, when the loss graph shows an nll_loss over those classes.
CHANCE_START = (0.8, 1.25)
#: A classifier's first observed loss this many times below the lower edge of that band, in a run met mid-training
#: (an optimizer already held state: a run resumed from a checkpoint, a model trained before the debugger was
#: attached), had learned before it was observed: its fit is measured from chance, where an untrained classifier's
#: starts, not from where the debugger first saw it.
CHANCE_BELOW = 4.0


def fit_converged(
    config: DebugConfig,
    gradient: float | None,
    first_gradient: float | None,
    loss: float | None,
    first_loss: float | None,
    from_chance: bool,
) -> bool:
    """:class:`FitProgress`'s test on readings of the loss's gradient w.r.t. the output and of the loss, against
    their first values (None: not read): the gradient at most ``fit_gradient_drop`` of its first, or the loss at
    most ``fit_loss_drop`` of its first, or, for a loss that began at a classifier's chance level
    (``from_chance``), the gradient it implies, ``1 - exp(-loss)``, at most ``fit_gradient_drop`` of its first."""
    if gradient is not None and first_gradient is not None and gradient <= config.fit_gradient_drop * first_gradient:
        return True
    if loss is None or first_loss is None:
        return False
    if loss <= config.fit_loss_drop * first_loss:
        return True
    return from_chance and -math.expm1(-loss) <= config.fit_gradient_drop * -math.expm1(-first_loss)


class FitProgress:
    """How far the fit has come, for detectors that must not mistake convergence for a fault.

    A fit that has converged has little left to learn: its gradients and updates shrink with the loss, and small
    ones are then the fit, not vanishing gradients or a stalled learning rate. It has converged at a step when the
    loss's gradient w.r.t. the model's output (always measured) is at most ``fit_gradient_drop`` of its first
    value, or the loss (reported with ``observe_loss`` or recorded from the backward pass) is at most
    ``fit_loss_drop`` of its first value. Judged at each step from that step's readings: a fit that diverges again
    is no longer converged. The first values are the first finite (and, for the loss, positive) readings: a loss
    that starts at or below 0 (a log-likelihood, a GAN's) is never compared.

    A squared error's gradient goes as the square root of the loss, so a hundredfold fall of the loss is the
    tenfold fall of the gradient. A cross-entropy's does not: its gradient w.r.t. the logits goes as the
    probability left off the right class, ``1 - exp(-loss)``, which has fallen tenfold when a binary classifier's
    loss went from log 2 to 0.05, not 0.0069. So a loss whose first value is a classifier's at chance
    (``CHANCE_START`` times log(classes), the classes read from the model's logits) has converged also when
    ``1 - exp(-loss)`` is at most ``fit_gradient_drop`` of its first value: the same test as the gradient's, for a
    model whose output is its loss (a Hugging Face model given its labels), where the gradient w.r.t. the output
    says nothing (it is 1). A first loss above that band is a cross-entropy too when the loss graph shows an
    ``nll_loss`` over the logits' classes (``label_classes``): an initialisation whose logits are larger than
    uniform ones starts it over chance (Hugging Face's Mamba: 1.27-1.32 log 64), and the probability left off the
    right class is then near 1 as it is at chance, so the same tenfold fall is a converged fit (a Mamba LM at
    100 % held-out accuracy, its loss fallen 85-89-fold, was judged unconverged and its step-size projection,
    small as the fit converged, reported as vanishing). Without that evidence a value over the band says nothing
    of what the loss is (a squared error over several outputs, a sum over tokens), and only the other tests apply.
    A classifier first seen far below chance (:data:`CHANCE_BELOW`) in a run met mid-training had learned before:
    its first value is its chance level, so a run resumed after its fit converged is judged converged as the same
    steps would be within the whole run.
    """

    def __init__(self) -> None:
        self._first_gradient: float | None = None
        self._first_loss: float | None = None
        self._cross_entropy = False  # the first loss is a classifier's at chance or over it

    def converged(self, view: StepView) -> bool:
        """Whether the fit has converged at ``view``'s step (also records the first readings)."""
        tg, loss = view.data.target_grad, view.data.loss
        if tg is not None and not (math.isfinite(tg) and tg >= 0):
            tg = None
        if tg is not None and self._first_gradient is None and tg > 0:
            self._first_gradient = tg
        if loss is not None and not (math.isfinite(loss) and loss >= 0):
            loss = None
        if loss is not None and self._first_loss is None and loss > 0:
            self._first_loss = loss
            classes = view.data.classes
            chance = math.log(classes) if classes >= 2 else math.nan
            # a classifier's cross-entropy at chance, or over it where the loss graph shows an nll_loss over the
            # logits' classes (the probability left off the right class is ~1 there as at chance)
            above = loss > CHANCE_START[1] * chance and view.data.label_classes == classes
            self._cross_entropy = CHANCE_START[0] * chance <= loss <= CHANCE_START[1] * chance or above
            # first seen far below chance in a run met mid-training (an optimizer held state): learned already.
            # A fresh run whose first loss is that low has a loss scaled down (divided by the data set's size)
            if view.data.warm_start and loss < CHANCE_START[0] * chance / CHANCE_BELOW:
                self._first_loss, self._cross_entropy = chance, True
        return fit_converged(view.ctx.config, tg, self._first_gradient, loss, self._first_loss, self._cross_entropy)


class Detector:
    """Base class: subclasses set ``name`` and ``event_type`` and implement :meth:`observe`."""

    name: str = "detector"
    event_type: EventType = EventType.ACTIVATION
    #: The signal whose state it classifies (default: its own name). Detectors of one track share one state per
    #: layer: a finding of one and none of the others is a change of that layer's state, not the end of a state.
    track: str = ""
    #: Whether it reads cheap (not fully observed) steps. False skips it on them: they carry no gradient,
    #: per-unit or update statistics. Plugins keep the default and see every step.
    every_step: bool = True

    @property
    def track_name(self) -> str:
        return self.track or self.name

    def observe(self, view: StepView) -> Observation | None:
        """Findings at one step, or None when this step carries nothing this detector reads."""
        raise NotImplementedError

    def quiet_on(self, data: StepData) -> bool:
        """Whether a cheap step holds nothing this detector would report, checked without building a view (then,
        while no state it found is open, the step skips it). Plugins keep the default: they see every step."""
        return False


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
