"""Saturated activations: tanh, sigmoid, hardtanh, softsign, hardsigmoid pinned at their bounds.

Only hidden activations count: a final sigmoid that grows confident is what a classifier should do, and saturation
matters because it cuts the gradient to the layers *before* it. Never applied to Linear outputs or logits. An
output is saturated when the activation's derivative there is below ``saturation_derivative`` of its maximum; a
layer is saturated when more than ``saturated_fraction`` of its outputs are.

Saturation a layer first reaches once the fit has converged (:class:`~neuraldbg.detectors.base.FitProgress`: the
loss or its gradient fell a hundredfold or tenfold) is the fit's confidence, not a fault: a confident fit drives a
tanh bottleneck to its bounds, and deep hashing pushes its codes to +-1 on purpose (plain torch: 54 % of a 32-bit
tanh code saturated once the loss fell 90-fold, held-out accuracy 0.998). Saturation present before the fit
converged (a bad initialisation, a learning rate too high) is still reported, for as long as it lasts, unless it
harmed nothing (:meth:`SaturatedActivations.undone`).

Saturation is a fault because it harms: the gradient through the saturated units dies, or the fit stalls while they are
pinned. Saturation the training drove the units to (it began after the run's first reading) that did neither is the
model's fit, and is undone: the layer feeding the activation (the nearest one with parameters before it) kept a gradient
of at least ``vanishing_ratio`` of the largest layer's at the most saturated step (the vanishing-gradients room's
relative test), and the fit converged through it, by the test :class:`FitProgress` applies at each step, here on the
medians of the run's last quarter of readings, after the onset: the loss fell a hundredfold, or its gradient w.r.t. the
output tenfold, or, for a classifier whose first loss was at chance, the gradient its loss implies (``1 - exp(-loss)``)
fell tenfold. Plain torch: a gated PixelCNN's tanh*sigmoid gates hold 50 % of a tanh at its bounds from step 80, when
its loss had fallen from 1.38 to 0.10 (not yet converged), and it goes on to 0.065 with its conditioning's gradient at
1e-2 of the largest layer's, as at step 0 (the "fix", a third of the learning rate, ends worse and still saturates); a
gated linear RNN's forget gate with chrono initialisation, 64 % saturated on purpose (memory over ~1000 steps), goes
from 0.70 to 0.005 with held-out accuracy 1.0, while the same model with the gate's bias at 0, unsaturated, stays at
0.70 (converged through, but saturated from its first step: see below). The saturation faults of the benchmark and of
the tests keep their feeding layer's gradient (0.15-1.0 of the largest layer's: the unsaturated units still pass it) but
none converges: a tanh MLP with weights x20 (loss 7.0 -> 8.5), a learning rate too high (2.3 -> 3.6; 2.3 -> 1.1, then
flat once saturated), a BERT-style pooler at std 1 (1.07 -> 0.72 against log 3 = 1.10), raw inputs (flat at chance),
normal_ init (151 -> 21, a regression). A loss that only keeps falling is no proof: a gated MLP at Adam 0.1 falls from
0.37 to 0.27 while saturated, four times the loss of the same model at 0.01, which never saturates; so saturation a fit
has not converged through is still reported (a gated PixelCNN stopped at a loss of 0.11, twelvefold below its start and
still falling, is one such false alarm). Saturation there from the first step is the scale a layer starts at and is
judged whatever the fit does next: the diagnosis benchmark's squeeze-excitation gate divided by a temperature of 0.01,
pinned at 0 or 1 from step 0, fits its easy patterns anyway (accuracy 0.98 in 40 steps) and is reported; so is, a known
false alarm, a forget gate saturated from its first step by chrono initialisation on purpose.

Root: the first saturated layer in forward order (downstream layers are its victims), after dead units. Config:
``saturation_derivative``, ``saturated_fraction``, ``vanishing_ratio``, ``fit_loss_drop``, ``fit_gradient_drop``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..config import DebugConfig
from ..detectors.base import CHANCE_START, Detector, Finding, FitProgress, Observation, StepView, fit_converged
from ..events import EventType, FailureKind, SemanticEvent
from ..health import ActivationHealth, GradientHealth, is_state
from ..reasoning.rules import CausalRule
from ..reasoning.topology import Topology
from ..stats.step import SlotKey
from ..text import num, pct
from . import loss_evidence, optimizer_settings
from .base import Check, Kind, RootLane, Series, held

if TYPE_CHECKING:
    from ..capture.coverage import Coverage, RunFacts
    from ..stats.history import Series as Readings

KIND = FailureKind.SATURATED_ACTIVATIONS


class SaturationDetector(Detector):
    name = "saturation"
    event_type = EventType.ACTIVATION
    every_step = False

    def __init__(self) -> None:
        self._fit = FitProgress()
        self._before: set[tuple[str, int]] = set()  # layers saturated at a step before the fit converged

    def observe(self, view: StepView) -> Observation | None:
        data = view.data
        fitted = self._fit.converged(view)  # also records the first readings
        if not data.saturated:
            return None
        threshold = view.ctx.config.saturated_fraction
        obs = Observation()
        top: float | None = None  # the largest layer gradient of this step, once a saturated layer asks for it
        for key, (count, total) in data.saturated.items():
            norm = data.act.get(key)
            if total <= 0 or not view.ctx.is_hidden(key) or (norm is not None and not math.isfinite(norm)):
                continue
            obs.saw(self.event_type, key[0], call=key[1])
            fraction = count / total
            if fraction > threshold and fitted and key not in self._before:
                continue  # saturation that a converged fit reached is its confidence (a hashing code at +-1)
            if fraction > threshold:
                self._before.add(key)
                s = (fraction - threshold) / (1 - threshold) if threshold < 1 else 1.0
                metrics = {"saturated_fraction": fraction, "elements": float(total)}
                if top is None:
                    top = max((g.norm for g in view.layer_gradients.values() if math.isfinite(g.norm)), default=0.0)
                share = self._feeding_share(view, key, top)
                if share is not None:
                    metrics["feeding_gradient_share"] = share
                obs.findings.append(
                    Finding(
                        self.event_type,
                        KIND,
                        key[0],
                        ActivationHealth.SATURATED,
                        metrics,
                        max(0.0, min(1.0, s)),
                        call=key[1],
                    )
                )
        return obs

    def _feeding_share(self, view: StepView, key: SlotKey, top: float) -> float | None:
        """The gradient norm of the layer that feeds ``key`` (the nearest one with parameters before it in forward
        order) as a share of ``top``, the largest layer's at this step: what still passes back through the saturated
        units. None when no layer feeds it or no gradient was measured."""
        feeding = view.layer_gradients.get(view.ctx.feeding(key) or "")
        if feeding is None or not math.isfinite(feeding.norm) or top <= 0:
            return None
        return feeding.norm / top


#: The share of the run's last steps whose readings (losses, the loss's gradients) say where the fit ended ...
LATE = 0.25
#: ... at least this many of them.
READINGS = 8


def _median(series: Readings | None, since: int) -> float | None:
    """The median of the finite readings of ``series`` from step ``since`` on; None with fewer than
    :data:`READINGS` of them."""
    values = sorted(v for step, v in series or () if step >= since and math.isfinite(v))
    return values[len(values) // 2] if len(values) >= READINGS else None


def _first(series: Readings | None) -> float | None:
    """The first reading of ``series`` when it is finite and positive (what a fall is measured from)."""
    first = next(iter(series or ()), None)
    return first[1] if first is not None and math.isfinite(first[1]) and first[1] > 0 else None


def converged_through(event: SemanticEvent, coverage: Coverage, facts: RunFacts) -> bool:
    """Whether the fit converged after ``event``'s saturation began: over the run's last :data:`LATE` of steps (and
    not before the event), the median loss is at most ``fit_loss_drop`` of the first, or the median gradient of the
    loss w.r.t. the output at most ``fit_gradient_drop`` of its first, or, for a classifier whose first loss was at
    chance (its cross-entropy's gradient goes as ``1 - exp(-loss)``), that quantity fell to ``fit_gradient_drop``:
    :class:`FitProgress`'s test, on a median rather than one step's batch."""
    history, cfg = facts.history, facts.config
    if history is None or coverage.losses.nonfinite or coverage.policy_gradient or loss_evidence.skipped(coverage):
        return False  # a loss that was not finite, or that says nothing of a fit (a surrogate, a GAN's)
    since = max(event.step_start, coverage.last_step - int(LATE * (coverage.last_step + 1)))
    losses, gradients = history.get("loss", ""), history.get("loss_gradient", "")
    late, first = _median(losses, since), _first(losses)
    chance = loss_evidence.chance_level(coverage)[1]
    at_chance = (
        first is not None and chance is not None and CHANCE_START[0] * chance <= first <= CHANCE_START[1] * chance
    )
    return fit_converged(cfg, _median(gradients, since), _first(gradients), late, first, at_chance)


def began_in_training(event: SemanticEvent, facts: RunFacts) -> bool:
    """Whether ``event``'s saturation began after the run's first loss reading: the training drove the units to
    their bounds. Saturation there from the first step is the scale the layer starts at (a gate's logits divided by
    a temperature of 0.01: its SE gate pinned at 0 or 1 from step 0, the diagnosis benchmark's
    ``holdout_saturated_se_gate_temperature``), an initialisation the rule judges whatever the fit does next."""
    losses = facts.history.get("loss", "") if facts.history is not None else None
    first = next(iter(losses or ()), None)
    return first is not None and event.step_start > first[0]


def gradient_kept(event: SemanticEvent, config: DebugConfig) -> bool:
    """Whether the layer feeding the activation kept a gradient at the event's most saturated step: at least
    ``vanishing_ratio`` of the largest layer's (the vanishing-gradients room's relative test). True when no layer
    feeds it."""
    share = event.metrics.get("feeding_gradient_share")
    return share is None or share >= config.vanishing_ratio


class SaturatedActivations(Kind):
    name = KIND.value
    lr_sensitive = True
    surge_victim = True
    confirms_escalation = True  # activations saturating during an explosion or a surge: what they do
    states = (ActivationHealth.SATURATED,)
    count_metrics = frozenset({"elements"})
    check = Check("assert_no_saturation", "saturated activations")

    def detectors(self, config: DebugConfig) -> list[Detector]:
        return [SaturationDetector()]

    def undone(self, event: SemanticEvent, coverage: Coverage, facts: RunFacts) -> bool:
        """Saturation that harmed nothing (see the module docstring): the training drove the units there (it
        began after the run's first reading, :func:`began_in_training`), the layer feeding the activation kept a
        gradient (:func:`gradient_kept`) and the fit converged through it (:func:`converged_through`)."""
        if event.kind is not KIND or not began_in_training(event, facts):
            return False  # saturated from the first step: the scale the layer starts at, which the rule judges
        if not gradient_kept(event, facts.config):
            return False  # the gradient through the saturated units died: the layer before them no longer learns
        return converged_through(event, coverage, facts)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(4)

    def rules(self) -> list[CausalRule]:
        return [
            CausalRule(
                "saturation-shrinks-upstream-gradients",
                "shrinks the gradient of",
                KIND,
                (GradientHealth.VANISHING,),
                "upstream",
                same_place_joins=True,
            ),
            CausalRule(
                "saturation-propagates",
                "saturates",
                KIND,
                (ActivationHealth.SATURATED,),
                "downstream",
                same_place_joins=True,
            ),
        ]

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        frac = root.metrics.get("saturated_fraction", 0.0)
        feeding = topo.feeding(root.layer)
        what = (
            f"Saturated activations in {topo.describe(root.layer)}: {pct(frac)} of its outputs sit at the bounds, "
            f"where the derivative is below 1% of its maximum, {held(root, topo)}."
        )
        shrunk = [e for e in rest if e.kind is not None and is_state(e.to_state, GradientHealth.VANISHING)]
        if shrunk:
            low = min(shrunk, key=lambda e: e.metrics.get("grad_norm", math.inf))
            what += f" Gradient norm falls to {num(low.metrics.get('grad_norm', 0.0))} at '{low.layer}'."
        target = f"'{feeding}'" if feeding else "the previous layer"
        if root.step_start > topo.first_step:  # not so at the start: training grew the activation's inputs
            grown = (
                f"the activation was not saturated at the start, and from step {root.step_start} the updates of "
                f"{target} had grown its inputs past its bounds; a normalisation layer before the activation, or a "
                "non-saturating activation (ReLU, GELU), keeps them in range."
            )
            momentum, fix = optimizer_settings.step_size_fix(series, root.step_start, grown)
            what += momentum  # the momentum, not the learning rate alone, made the steps that large
        else:
            fix = (
                f"the inputs of the activation are too large - scale down the initialisation of {target} "
                "(Xavier/Glorot for tanh and sigmoid), normalise the inputs, add a normalisation layer before the "
                "activation, or use a non-saturating activation (ReLU, GELU)."
            )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"{pct(event.metrics.get('saturated_fraction', 0.0))} of outputs saturated"

    def label(self, event: SemanticEvent) -> str:
        return f"saturated: {pct(event.metrics.get('saturated_fraction', 0.0))} of outputs"

    def effect(self, event: SemanticEvent) -> str:
        return "saturated outputs"
