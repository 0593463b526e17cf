"""Stalled updates: the optimizer barely moves the weights, so the loss cannot improve.

Measured on fully observed steps (see :class:`~neuraldbg.detectors.base.UpdateCensus`): the median update/weight
ratio ||dW||/||W|| over the model's layers is below ``stalled_ratio`` (a learning rate far too small for this
model). A single layer with small updates is usually a symptom of vanishing gradients and is reported there. When
nothing moves at all and the optimizers hold the parameters with learning rate 0 (a schedule that reached 0), that
is one global stall, not every parameter frozen.

A model whose fit has converged (:class:`~neuraldbg.detectors.base.FitProgress`), or whose gradients fell a
hundredfold from their first values (a stationary point: a noisy regression at its least-squares optimum keeps a
loss well above 0, but its gradients go to 0), makes small updates because it has little left to learn: that is the
fit, not a stall. Both are judged against the run's first values, so a run the debugger met mid-training (its
optimizer already held state: a resumed run, a fine-tuning script) is judged against its own observed history: its
updates stall when they fall tenfold below their first observed ratio and under ``stalled_ratio`` (a schedule that
decays to nothing while watched); updates that were that small from the first observed step on are the regime the
run was already in (late training, small gradients), which the debugger did not see begin. Root: after vanishing
gradients, which stall updates by themselves under SGD. Config:
``stalled_ratio``, ``fit_gradient_drop``, ``fit_loss_drop``.
"""

from __future__ import annotations

import math

from ..config import DebugConfig
from ..detectors.base import Detector, Finding, FitProgress, Observation, StepView, strength
from ..events import EventType, FailureKind, SemanticEvent
from ..health import UpdateHealth
from ..reasoning.topology import Topology
from ..text import num
from .base import Check, Kind, RootLane, Series, held

KIND = FailureKind.STALLED_UPDATES


class StalledDetector(Detector):
    name = "stalled"
    track = "update"
    event_type = EventType.UPDATE
    every_step = False

    def __init__(self) -> None:
        self._fit = FitProgress()
        self._first_gradient: float | None = None  # the largest layer gradient norm at the first observed step
        self._resumed = False  # the run trained before the debugger attached
        self._first_median: float | None = None  # the median update ratio at the first observed update

    def _stationary(self, view: StepView) -> bool:
        """The model's largest layer gradient fell to ``fit_gradient_drop`` squared (1 %) of its first value: the
        fit reached a stationary point (a noisy regression at its least-squares optimum, whose loss stays well
        above 0), where small updates follow from small gradients, not from the learning rate."""
        top = max((g.norm for g in view.layer_gradients.values() if math.isfinite(g.norm)), default=0.0)
        if top <= 0:
            return False
        if self._first_gradient is None:
            self._first_gradient = top
        return top <= view.ctx.config.fit_gradient_drop**2 * self._first_gradient

    def observe(self, view: StepView) -> Observation | None:
        fitted, stationary = self._fit.converged(view), self._stationary(view)  # both record first readings
        self._resumed |= view.data.resumed
        converged = fitted or stationary
        census = view.updates
        if census is None:
            return None
        obs = Observation()
        if census.at_lr_zero:
            obs.saw(self.event_type, "")
            if not converged:
                metrics = {"median_update_ratio": 0.0, "max_update_ratio": 0.0, "lr": census.lr_any}
                obs.findings.append(self._finding(metrics, 1.0))
        elif census.ratios and (census.moving or census.stepped_ever):
            obs.saw(self.event_type, "")
            limit = view.ctx.config.stalled_ratio
            if self._first_median is None:
                self._first_median = census.median
            # met mid-training: small from the first observed update on is the regime it was in, not a stall
            regime = self._resumed and census.median > 0.1 * self._first_median
            if census.median < limit and not converged and not regime:
                obs.findings.append(self._finding(census.ratio_metrics(), strength(census.median, limit, decades=3)))
        return obs

    def _finding(self, metrics: dict[str, float], s: float) -> Finding:
        return Finding(self.event_type, KIND, "", UpdateHealth.STALLED, metrics, s)


class StalledUpdates(Kind):
    name = KIND.value
    states = (UpdateHealth.STALLED,)
    check = Check("assert_parameters_update", "parameters do not update")

    def detectors(self, config: DebugConfig) -> list[Detector]:
        return [StalledDetector()]

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(7)

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        median = root.metrics.get("median_update_ratio", 0.0)
        lr = root.metrics.get("lr")
        if median == 0.0:
            what = (
                f"Stalled updates: no parameter changes at all {held(root, topo)}"
                + (" - the learning rate is 0" if lr == 0.0 else "")
                + "; the loss cannot improve."
            )
            fix = (
                "check the learning-rate scheduler (a schedule sized for epochs but stepped per batch reaches 0 early)."
            )
            return what, fix
        lr_text = f" with learning rate {num(lr)}" if lr is not None else ""
        what = (
            f"Stalled updates{lr_text}: the median update/weight ratio ||dW||/||W|| over the layers is {num(median)} "
            f"per step {held(root, topo)}; the weights barely move, so the loss cannot improve."
        )
        factor = 1e-3 / median
        fix = (
            f"raise the learning rate (about {num(factor)}x higher reaches the usual ~1e-3 update ratio), and check "
            "the scheduler and warm-up."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        ratio = event.metrics.get("median_update_ratio", 0.0)
        if ratio == 0.0:
            return "no parameter moves at all"
        updates = "" if not event.layer and event.param is None else "updates "  # read after "the model's updates"
        return f"{updates}stalled (median update/weight ratio {num(ratio)})"

    def label(self, event: SemanticEvent) -> str:
        return f"stalled: update ratio {num(event.metrics.get('median_update_ratio', 0.0))}"

    def effect(self, event: SemanticEvent) -> str:
        return "stalled updates"
