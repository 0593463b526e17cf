"""Saturated activations: tanh, sigmoid, hardtanh, softsign, hardsigmoid pinned at their bounds.

Only hidden activations count: a final sigmoid that grows confident is what a classifier should do, and saturation
matters because it cuts the gradient to the layers *before* it. Never applied to Linear outputs or logits. An
output is saturated when the activation's derivative there is below ``saturation_derivative`` of its maximum; a
layer is saturated when more than ``saturated_fraction`` of its outputs are.

Saturation a layer first reaches once the fit has converged (:class:`~neuraldbg.detectors.base.FitProgress`: the
loss or its gradient fell a hundredfold or tenfold) is the fit's confidence, not a fault: a confident fit drives a
tanh bottleneck to its bounds, and deep hashing pushes its codes to +-1 on purpose (plain torch: 54 % of a 32-bit
tanh code saturated once the loss fell 90-fold, held-out accuracy 0.998). Saturation present before the fit
converged (a bad initialisation, a learning rate too high) is still reported, for as long as it lasts.

Root: the first saturated layer in forward order (downstream layers are its victims), after dead units. Config:
``saturation_derivative``, ``saturated_fraction``.
"""

from __future__ import annotations

import math

from ..config import DebugConfig
from ..detectors.base import Detector, Finding, FitProgress, Observation, StepView
from ..events import EventType, FailureKind, SemanticEvent
from ..health import ActivationHealth, GradientHealth, is_state
from ..reasoning.rules import CausalRule
from ..reasoning.topology import Topology
from ..text import num, pct
from .base import Check, Kind, RootLane, Series, held, near

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
            lr = near(series, "lr", "", root.step_start)
            now = f" (now {num(lr)})" if lr is not None else ""
            fix = (
                f"lower the learning rate{now} or clip gradients: the activation was not saturated at the start, "
                f"and from step {root.step_start} the updates of {target} had grown its inputs past its bounds; a "
                "normalisation layer before the activation, or a non-saturating activation (ReLU, GELU), keeps them "
                "in range."
            )
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
