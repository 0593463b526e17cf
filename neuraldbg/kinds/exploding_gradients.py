"""Exploding gradients: a layer's gradient far larger than training can use, and the evidence around it.

**Exploding** (:class:`ExplodingDetector`): a layer's gradient norm above ``exploding_norm``, judged before clipping
(``clip_grad_norm_`` hides an explosion, it does not cure it) and measured in units of the loss's own gradient
scale. Every parameter gradient is proportional to d(loss)/d(output): a loss summed over N elements
(``reduction="sum"``, a VAE's usual reconstruction term) multiplies every gradient by N compared with its mean,
with no change to what Adam-like optimizers do. So the threshold is multiplied by the loss gradient's norm whenever
that is above 1 (the smallest seen so far: the loss's reduction is fixed for a run, while a real explosion inflates
the loss gradient too). Mean-reduced losses have loss gradients below 1 and keep the plain threshold. Once a layer
explodes, readings down to ``exploding_hold`` of the threshold continue its state without confirming it
(provisional): a clipped recurrent net whose raw norm swings between 5e2 and 7e3 from step to step is one
explosion, not a series of blips too short to count, while a single spike followed by smaller readings never
becomes one. An explosion that turns into another failure (NaN, dead units) was real, however short it was.

Evidence this kind owns (kind-less events that explain its failures):

* *outputs blowing up* (:class:`MagnitudeDetector`): a layer output whose rms exceeds ``anomalous_rms``;
* *amplifying layers* (:class:`GainDetector`): on fully observed steps, a layer that owns parameters (not a
  normalisation layer, whose job is rescaling) whose output rms is ``amplifying_gain`` times the rms of the output
  just before it in forward order (the model's input, for the first layer). Present from the first step, it
  localises an explosion to the layer whose weights are too large for its input;

Updates as large as the weights that start with or after an explosion are its consequence (the rule
``explosion-inflates-updates``); before it they are the learning rate's (:mod:`neuraldbg.kinds.oversized_updates`).

Root: the earliest acute failure (an explosion or a non-finite value, whichever comes first). An explosion present
from the first step is rooted at the first layer amplifying its input, else at the first layer whose outputs blow
up (an activation module is blamed on the layer feeding it); one that begins mid-run at the first exploding layer
in forward order (the dynamics: the learning rate). Config: ``exploding_norm``, ``exploding_hold``,
``anomalous_rms``, ``amplifying_gain``.

Explained: an explosion rooted at its gradients and present on the first step was measured before the optimizer's
first update, so no learning rate caused it: the initial forward pass did. Where no single layer amplifies, the
growth can sit in the model's own forward code between layers (a residual MLP whose 8 blocks add their skip twice:
layer outputs from rms 0.17 at 'blocks.0.fc2' to 49 at 'blocks.7.fc1', a first loss 1.9e+3 times the targets' mean
square, held-out R^2 -1.07 against 0.986 with one skip): the explanation names that growth along the forward order
(:data:`FORWARD_GROWTH`) and the first loss against the targets' scale, and the fix is the forward pass's scale
(skip connections, normalisation, initialisation) before clipping. Regression targets or inputs far from unit
scale keep their own fixes; an explosion that begins mid-run keeps the learning rate's.
"""

from __future__ import annotations

import dataclasses
import math

from ..config import DebugConfig
from ..detectors.base import Detector, Finding, Observation, StepView, strength
from ..events import EventType, FailureKind, SemanticEvent
from ..health import ActivationHealth, GradientHealth, UpdateHealth, is_state
from ..reasoning.rules import ONSET_TOLERANCE, CausalRule, is_update_surge
from ..reasoning.topology import Topology
from ..stats.step import StepData
from ..text import num, quoted
from . import loss_evidence
from .base import Check, Kind, RootLane, RootPool, Series, held, near

KIND = FailureKind.EXPLODING_GRADIENTS

#: Evidence of values blowing up, which an explosion explains.
_BLOW_UP = (ActivationHealth.ANOMALOUS, ActivationHealth.AMPLIFYING)
#: Values turned non-finite (what an explosion ends in).
_NON_FINITE = (GradientHealth.NON_FINITE, ActivationHealth.NON_FINITE)


class ExplodingDetector(Detector):
    name = "exploding"
    track = "gradient"
    event_type = EventType.GRADIENT
    every_step = False

    def __init__(self) -> None:
        self._loss_scale: float | None = None  # smallest finite, positive pull of the loss on the output seen
        self._data_scale: float | None = None  # smallest finite, positive rms of the input batch seen
        self._exploding: set[str] = set()  # layers whose last reading was exploding
        self._above: dict[str, int] = {}  # layer -> the last step its reading was above the limit
        self._first: dict[str, float] = {}  # layer -> its first finite, positive reading (before clipping)

    def _scale(self, data: StepData) -> float:
        """The run's own gradient scale: the loss's pull on the output (half the sum of |d(loss)/d(output)|: the
        error in the units of the targets for a mean-reduced loss, times the element count for a summed one; at
        most 1 for a mean cross-entropy) times the rms of the input batch, each counted when above 1 and taken as the
        smallest seen so far (the reduction and the data's units are fixed for a run, while a real explosion
        inflates the loss gradient too). A weight gradient is the product of the gradient arriving at its layer
        and that layer's input, both in these units."""
        # in units of the pull of a mean-reduced loss whose error is one unit everywhere (2: a mean squared error
        # off by 1, a cross-entropy sure of the wrong class), so that normalised problems keep the plain threshold
        pull = data.target_grad_sum / 2 if data.target_grad_sum is not None else data.target_grad
        if pull is not None and math.isfinite(pull) and pull > 0:
            self._loss_scale = pull if self._loss_scale is None else min(self._loss_scale, pull)
        if data.input_norm is not None and data.input_numel > 0:
            rms = data.input_norm / math.sqrt(data.input_numel)
            if math.isfinite(rms) and rms > 0:
                self._data_scale = rms if self._data_scale is None else min(self._data_scale, rms)
        return self.loss_scale * self.data_scale

    @property
    def loss_scale(self) -> float:
        return max(1.0, self._loss_scale or 0.0)

    @property
    def data_scale(self) -> float:
        return max(1.0, self._data_scale or 0.0)

    def observe(self, view: StepView) -> Observation | None:
        grads = view.layer_gradients
        if not grads:
            return None
        cfg = view.ctx.config
        top = max((g.norm for g in grads.values() if math.isfinite(g.norm)), default=0.0)
        clip = view.data.grad_clip_factor or 1.0
        scale = self._scale(view.data)
        limit = cfg.exploding_norm * scale
        step = view.step
        obs = Observation()
        obs.saw_each(self.event_type, grads)
        for layer, g in grads.items():
            was_exploding = layer in self._exploding
            self._exploding.discard(layer)  # added back below while it keeps exploding
            if g.non_finite:
                continue  # another state of this gradient (the non-finite detector's)
            raw = g.norm * clip  # judged before clipping: clip_grad_norm_ hides, not heals
            if layer not in self._first and math.isfinite(raw) and raw > 0:
                self._first[layer] = raw
            # in the run's units, or grown from its own start past the plain threshold (a diverging run)
            grown = raw > cfg.exploding_norm and raw > cfg.exploding_growth * self._first.get(layer, math.inf)
            above = raw > limit or grown
            if above:
                self._above[layer] = step
            # the hold: readings below the limit continue an explosion while it keeps coming back above it (a
            # swinging norm), not once it has fallen and stays flat or falls further
            held = (
                was_exploding
                and raw > limit * cfg.exploding_hold
                and step - self._above.get(layer, step) < cfg.persistence_steps
            )
            if above or held:
                metrics = {"grad_norm": g.norm, "max_layer_grad_norm": top}
                if clip > 1:
                    metrics.update(grad_norm=raw, clipped_grad_norm=g.norm, clip_factor=clip)
                if self.loss_scale > 1:
                    metrics["loss_gradient_scale"] = self.loss_scale
                if self.data_scale > 1:
                    metrics["input_scale"] = self.data_scale
                s = strength(raw, limit if raw > limit else cfg.exploding_norm, decades=3, above=True)
                finding = Finding(self.event_type, KIND, layer, GradientHealth.EXPLODING, metrics, s)
                if not above:
                    finding = dataclasses.replace(finding, provisional=True)
                obs.findings.append(finding)
                self._exploding.add(layer)
        return obs


class MagnitudeDetector(Detector):
    """Outputs blowing up: a layer output whose rms exceeds ``anomalous_rms`` (evidence, no kind of its own)."""

    name = "magnitude"
    event_type = EventType.ACTIVATION
    every_step = False

    def observe(self, view: StepView) -> Observation | None:
        data = view.data
        if not data.act:
            return None
        limit = view.ctx.config.anomalous_rms
        obs = Observation()
        for key in data.act:
            rms = view.rms(key)
            if not math.isfinite(rms):
                continue
            obs.saw(self.event_type, key[0], call=key[1])
            if rms > limit:
                s = strength(rms, limit, decades=3, above=True)
                obs.findings.append(
                    Finding(
                        self.event_type, None, key[0], ActivationHealth.ANOMALOUS, {"output_rms": rms}, s, call=key[1]
                    )
                )
        return obs


class GainDetector(Detector):
    """Amplifying layers: a parametric layer whose output is ``amplifying_gain`` times larger than its input."""

    name = "gain"
    event_type = EventType.ACTIVATION
    every_step = False

    def observe(self, view: StepView) -> Observation | None:
        ctx, data = view.ctx, view.data
        if not data.full or not data.act:
            return None
        limit = ctx.config.amplifying_gain
        obs = Observation()
        previous = data.input_norm / math.sqrt(data.input_numel) if data.input_norm and data.input_numel else None
        for key in ctx.order:
            rms = view.rms(key)
            info = ctx.infos[key[0]]
            if key[1] == 0 and info.numel and not info.normalizes and previous and math.isfinite(rms):
                obs.saw(self.event_type, key[0])
                gain = rms / previous
                if gain > limit and math.isfinite(previous):
                    s = strength(gain, limit, decades=2, above=True)
                    metrics = {"gain": gain, "output_rms": rms}
                    obs.findings.append(Finding(self.event_type, None, key[0], ActivationHealth.AMPLIFYING, metrics, s))
            if key in data.act:
                previous = rms
        return obs


@dataclasses.dataclass(frozen=True)
class AnomalyEvidence(CausalRule):
    """Activations blowing up (anomalous or amplifying layers) belong to the explosion that shows them."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        return (
            cause.kind is KIND
            and effect.kind is None
            and effect.to_state in self.effect_states
            and effect.step_end >= cause.step_start - ONSET_TOLERANCE
        )

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return None  # a layer may have been blowing up before its gradients crossed the threshold

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        return a.step_start <= b.step_start


@dataclasses.dataclass(frozen=True)
class InflatedUpdates(CausalRule):
    """Exploding gradients make the updates as large as the weights (an update surge that starts with or after the
    explosion is its consequence, not a learning rate too high)."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        return cause.kind is KIND and is_update_surge(effect) and effect.step_start >= cause.step_start

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return cause.step_start

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        return a.step_start <= b.step_start


#: A gradient norm beyond this holds elements whose square may overflow float32 (its largest value is ~3.4e38): an
#: adaptive optimizer's second moment then becomes inf and its updates 0 (plain torch, a RealNVP flow initialised
#: with N(0, 3) weights: gradients up to 5.9e33, Adam's exp_avg_sq inf, the weights unchanged for 300 steps).
SQUARE_OVERFLOW = 1.8e19


class OverflowStalls(CausalRule):
    """Gradients so large that their squares overflow stall the updates of an adaptive optimizer (Adam, RMSprop):
    its second-moment estimate is inf, every update 0. The stall is the explosion's consequence, not a learning
    rate too low or a schedule."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        if cause.kind is not KIND or effect.kind is not FailureKind.STALLED_UPDATES:
            return False
        return _largest(cause) >= SQUARE_OVERFLOW and effect.step_end >= cause.step_start - ONSET_TOLERANCE

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return None  # a stall from the run's start is explained by an explosion found a few steps into it

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        return a.step_start <= b.step_start and _largest(a) >= _largest(b)


def _largest(event: SemanticEvent) -> float:
    """The largest gradient norm an exploding-gradients event holds (0 when it holds none)."""
    return max(event.metrics.get("grad_norm", 0.0), event.metrics.get("max_layer_grad_norm", 0.0))


class ExplodingGradients(Kind):
    name = KIND.value
    acute = True
    lr_sensitive = True
    lists_own = True
    states = (GradientHealth.EXPLODING,)
    evidence = (ActivationHealth.ANOMALOUS, ActivationHealth.AMPLIFYING)
    confirmed_by_escalation = (GradientHealth.EXPLODING,)
    check = Check("assert_no_exploding_gradients", "exploding gradients")

    def detectors(self, config: DebugConfig) -> list[Detector]:
        return [ExplodingDetector(), MagnitudeDetector(), GainDetector()]

    def lane(self, event: SemanticEvent) -> RootLane | None:
        if event.kind is KIND:
            return RootLane(2, order=0)
        return None

    def choose_root(self, head: SemanticEvent, pool: RootPool) -> SemanticEvent:
        """``head``: the first exploding layer in forward order at the earliest onset."""
        if head.kind is not KIND:
            return head
        amplifying = pool.first_evidence(ActivationHealth.AMPLIFYING)
        if amplifying is not None:  # a layer amplifying its input from the first step: its weights are too large
            return amplifying
        if head.step_start > pool.topo.first_step:
            return head  # appeared mid-run: the dynamics (learning rate), not one layer's weights
        origin = pool.first_evidence(ActivationHealth.ANOMALOUS)
        if origin is None:
            return head
        # present from the start with activations blowing up: the first layer whose outputs blow up has weights
        # too large for its input (an activation module that blows up is blamed on the layer feeding it)
        if pool.topo.roles.get(origin.layer) == "parametric":
            return origin
        feeding = pool.topo.feeding(origin.layer)
        fed = pool.first_evidence(ActivationHealth.ANOMALOUS, feeding) if feeding is not None else None
        return fed if fed is not None else origin

    def rules(self) -> list[CausalRule]:
        def rule(name: str, relation: str, effects: tuple[GradientHealth | ActivationHealth, ...]) -> CausalRule:
            return CausalRule(name, relation, KIND, effects, same_place_joins=True)

        return [
            rule("explosion-spreads", "spreads to", (GradientHealth.EXPLODING,)),
            rule("explosion-overflows", "overflows into", _NON_FINITE),
            rule("explosion-kills-units", "kills units of", (ActivationHealth.DEAD,)),
            rule("explosion-saturates", "saturates", (ActivationHealth.SATURATED,)),
            AnomalyEvidence(
                "explosion-shows-in-activations", "blows up the outputs of", KIND, (None,), "any", _BLOW_UP, False, True
            ),
            InflatedUpdates(
                "explosion-inflates-updates", "inflates", KIND, (None,), "any", (UpdateHealth.EXPLODING,), False, True
            ),
            OverflowStalls("explosion-overflows-the-optimizer", "stalls", KIND, (FailureKind.STALLED_UPDATES,)),
        ]

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        spread = [e for e in rest if e.kind is KIND and e.event_type is EventType.GRADIENT]
        nonfinite = [e for e in rest if e.kind is not None and e.to_state in _NON_FINITE]
        layers = sorted({e.layer for e in spread}, key=topo.position)
        worst = max(spread, key=lambda e: e.metrics.get("grad_norm", 0.0), default=None)
        gradients = (
            f" Gradients explode in {quoted(layers)} (norm up to {num(worst.metrics.get('grad_norm', math.inf))} at "
            f"'{worst.layer}', from step {min(e.step_start for e in spread)})."
            if worst is not None
            else ""
        )
        lr = near(series, "lr", "", root.step_start)
        if root.kind is None and is_state(
            root.to_state, ActivationHealth.AMPLIFYING
        ):  # blowing up its input from the start
            what = (
                f"{topo.describe(root.layer)} amplifies its input {num(root.metrics.get('gain', math.inf))}x "
                f"{held(root, topo)} (output rms {num(root.metrics.get('output_rms', math.inf))}), from the first "
                "step: its weights are too large for its input." + gradients
            )
            fix = _reinitialise(root, topo)
        elif root.kind is None:  # activations blowing up from the first step: the origin's weights are too large
            what = (
                f"Outputs of {topo.describe(root.layer)} blow up {held(root, topo)} (rms "
                f"{num(root.metrics.get('output_rms', math.inf))}) from the first step: its weights are too large for "
                "its input." + gradients
            )
            fix = _reinitialise(root, topo)
        else:
            what = (
                f"Exploding gradients from step {root.step_start}: gradient norm "
                f"{num(root.metrics.get('grad_norm', math.inf))} at {topo.describe(root.layer)}"
                + (f", and {len(layers)} more layers." if layers else ".")
            )
            ratio = near(series, "update_ratio", root.layer, root.step_start)
            if ratio is not None and math.isfinite(ratio) and ratio > 0.1:
                what += f" Updates reach {num(ratio)}x the weights per step."
            fix = lower_lr(lr)
            raw = loss_evidence.raw_input_rms(series, topo.last_step)
            targets = loss_evidence.raw_target_rms(series)
            calm = ratio is None or not ratio >= STEADY_UPDATE  # updates of ordinary size: not a learning rate's doing
            if targets is not None and calm:  # a regression's gradients scale with its targets
                what += (
                    f" The regression targets' root-mean-square is {num(targets)}: the loss's gradients grow with them."
                )
                fix = (
                    f"standardise the regression targets (root-mean-square {num(targets)}): train on (y - mean) / "
                    "std and map the predictions back; a lower learning rate would only slow the fit of values this "
                    "far from unit scale"
                    + (f", and normalise the inputs too (root-mean-square {num(raw)})" if raw is not None else "")
                    + "; then, if gradients still explode, "
                    + fix
                )
            elif raw is not None and calm:  # the gradients scale with the input: a lower learning rate only slows it
                what += f" The input batch's root-mean-square is {num(raw)}: the data are far from unit scale."
                fix = (
                    f"normalise the inputs (and regression targets) to about unit scale (their root-mean-square is "
                    f"{num(raw)}): a layer's weight gradients grow with its input, and a lower learning rate would "
                    "only slow the fit; then, if gradients still explode, " + fix
                )
            elif root.step_start <= topo.first_step:  # before any update: the forward pass's scale, not the rate
                found, fix = _at_initialisation(root, topo, series)
                what += found
            clipped = root.metrics.get("clipped_grad_norm")
            if clipped is not None:
                what += (
                    f" Gradient clipping cut the total norm {num(root.metrics.get('clip_factor', math.nan))}x before "
                    f"the optimizer step ('{root.layer}' reached it at {num(clipped)}): clipping bounds the steps but "
                    "hides the explosion, and the direction it keeps is dominated by the exploding part."
                )
                fix = (
                    f"find why the gradients of {topo.describe(root.layer)} are this large: for a recurrent layer, "
                    "scale down its recurrent weights (orthogonal initialisation); otherwise lower the learning rate "
                    "or add normalisation. Keep clipping as a guard, not a cure."
                )
        if nonfinite:
            what += f" Values turn non-finite at step {min(e.step_start for e in nonfinite)}."
        fell = unbounded_fall(series)
        if fell is not None:
            what += (
                f" Meanwhile the loss fell without bound, from {num(fell[0])} to {num(fell[1])}: a term of it has no "
                "lower bound, and the gradients grow as it is pushed down."
            )
            fix = (
                "check the sign of each term of the loss: a divergence or a penalty subtracted instead of added (a "
                "VAE's KL term with its sign flipped) is maximised without bound, and so is a likelihood whose "
                "variance may shrink to zero; lowering the learning rate only slows that. Then " + fix
            )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        m = event.metrics
        if is_state(event.to_state, ActivationHealth.ANOMALOUS):
            return f"outputs blowing up (rms {num(m.get('output_rms', math.inf))})"
        if is_state(event.to_state, ActivationHealth.AMPLIFYING):
            return f"amplifies its input {num(m.get('gain', math.inf))}x"
        clipped = m.get("clipped_grad_norm")
        tail = f", clipped to {num(clipped)}" if clipped is not None else ""
        return f"gradient exploding (norm {num(m.get('grad_norm', math.inf))}{tail})"

    def label(self, event: SemanticEvent) -> str:
        if event.kind is KIND:
            return f"exploding gradient: {num(event.metrics.get('grad_norm', 0.0))}"
        if is_state(event.to_state, ActivationHealth.ANOMALOUS):
            return f"outputs blow up: rms {num(event.metrics.get('output_rms', 0.0))}"
        return self.describe(event)

    def effect(self, event: SemanticEvent) -> str:
        if is_state(event.to_state, ActivationHealth.ANOMALOUS):
            return "outputs blowing up"
        if is_state(event.to_state, ActivationHealth.AMPLIFYING):
            return "layers amplifying their input"
        return "exploding gradients"


#: Updates of at least this share of the weights per step where gradients explode are the learning rate's doing,
#: whatever the inputs' scale (a sub-pixel CNN on 0-255 pixels at Adam 1.0; at 1e-2 the same pixels train): below
#: it, on inputs far from unit scale, the inputs are named first (a TCN on a series x1000 at Adam 2e-3).
STEADY_UPDATE = 0.02


#: A loss that falls below minus this many times the size of its first value (or of 1) fell without bound: no
#: fit of a loss bounded below gets there.
UNBOUNDED = 1000.0


def unbounded_fall(series: Series | None) -> tuple[float, float] | None:
    """(first, lowest) finite loss of the run when the loss fell without bound (see :data:`UNBOUNDED`), else None."""
    if series is None:
        return None
    finite = [v for _, v in series("loss", "") if math.isfinite(v)]
    if not finite:
        return None
    lowest = min(finite)
    return (finite[0], lowest) if lowest < -UNBOUNDED * max(1.0, abs(finite[0])) else None


def lower_lr(lr: float | None) -> str:
    """The fix for a learning rate far too high."""
    now = f" (now {num(lr)})" if lr is not None else ""
    return (
        f"lower the learning rate{now}, e.g. 10x smaller; clip gradients with "
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); add normalisation layers; check that inputs and "
        "targets are normalised."
    )


#: Layer outputs whose rms grows this many times along the forward order on the first step (from the quietest
#: parametric layer to the loudest after it, before the exploding one) show the forward pass growing at
#: initialisation. A residual MLP whose 8 blocks add their skip twice: 294x ('blocks.0.fc2' 0.17, 'blocks.7.fc1'
#: 48.9); the same net with one skip per block, healthy: 2.7x (plain torch, its first batch).
FORWARD_GROWTH = 10.0
#: A first loss this many times the targets' mean square (what predicting 0 costs a mean squared error) comes from
#: outputs far out of the targets' scale: the residual MLP above, 8.0e+3 against 4.2 (1.9e+3x); its twin 1.1x.
LOSS_OFF_SCALE = 10.0


def _at_initialisation(root: SemanticEvent, topo: Topology, series: Series | None) -> tuple[str, str]:
    """What the first step says about an explosion present on it, and its fix. Its gradients were taken before the
    optimizer's first update, so no learning rate made them: the initial forward pass did. Where the layers'
    outputs grow along the forward order (functional code between them, such as a skip added twice, amplifies
    where no single layer does), that growth is named, with the first loss against the targets' scale."""
    start = topo.first_step
    before = [
        (layer, rms)
        for layer in topo.order[: topo.position(root.layer)]
        if (rms := near(series, "output_rms", layer, start)) is not None and math.isfinite(rms) and rms > 0
    ]
    what = (
        f" It is there on the first step (step {start}), before any update: no learning rate caused it, the "
        "initial forward pass did."
    )
    where = ""
    span = _growth(before)
    if span is not None:
        (quiet, low), (loud, high) = span
        head = near(series, "output_rms", root.layer, start)
        what += (
            f" The layers' outputs grow {num(high / low)}x along the forward order at initialisation, from rms "
            f"{num(low)} at '{quiet}' to {num(high)} at '{loud}'"
            + (f", and {topo.describe(root.layer)} outputs rms {num(head)}" if head is not None else "")
            + f": '{root.layer}' receives an input far out of scale."
        )
        where = f" between '{quiet}' and '{loud}'"
    what += _first_loss(series, start)
    fix = (
        f"fix the scale of the forward pass at initialisation{where}: check the residual (skip) connections (a skip "
        "added twice, branches summed without a scale factor), missing normalisation layers, and the "
        "initialisation scale of the layers (Kaiming for ReLU, Xavier for tanh); a lower learning rate would not "
        "help, as the gradients are this large before any update. Then, as a guard, clip gradients with "
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)."
    )
    return what, fix


def _growth(outputs: list[tuple[str, float]]) -> tuple[tuple[str, float], tuple[str, float]] | None:
    """The (quietest, loudest) layer outputs, in forward order, the quietest before the loudest, when the loudest's
    rms is :data:`FORWARD_GROWTH` times the quietest's or more; else None."""
    if not outputs:
        return None
    loud = max(range(len(outputs)), key=lambda i: outputs[i][1])
    quiet = min(outputs[: loud + 1], key=lambda p: p[1])
    return (quiet, outputs[loud]) if outputs[loud][1] >= FORWARD_GROWTH * quiet[1] else None


def _first_loss(series: Series | None, start: int) -> str:
    """The first loss against a regression's targets' mean square when it is :data:`LOSS_OFF_SCALE` times that or
    more (the targets' rms is known for mean squared and Huber losses only); else nothing."""
    loss, rms = near(series, "loss", "", start), near(series, "target_rms", "", start)
    if loss is None or rms is None or not math.isfinite(rms) or rms <= 0:
        return ""
    square = rms**2
    if not loss >= LOSS_OFF_SCALE * square:
        return ""
    return (
        f" The first loss, {num(loss)}, is {num(loss / square)}x the targets' mean square ({num(square)}, the loss "
        "of predicting 0): the outputs are far out of the targets' scale before any update."
    )


def _reinitialise(root: SemanticEvent, topo: Topology) -> str:
    return (
        f"re-initialise {topo.describe(root.layer)} with a scale that fits its fan-in (Kaiming for ReLU, "
        "Xavier for tanh) or add normalisation after it; clipping gradients would only hide it."
    )
