"""What the optimizer did to the weights: frozen parameters and stalled updates.

Measured, not inferred from optimizer settings: on fully observed steps the weights are copied before the
optimizer steps and compared after.

* Frozen: a parameter that received a non-zero gradient and was left exactly unchanged (missing from every
  optimizer, or in a group with learning rate 0). Parameters with ``requires_grad=False`` get no gradient and
  are never reported: freezing a backbone on purpose is not a fault. Nor is a step its optimizer skipped: a
  parameter stepped at an earlier observed step and not at this one belongs to an optimizer that steps on other
  steps (a GAN's generator while the discriminator's optimizer steps); such a step says nothing about it, and
  is left out of the update ratios too. (Observed every 16th step, alternating optimizers would otherwise always
  be seen on the same player's turn.)
* Stalled: the median update/weight ratio ||dW||/||W|| over the model's layers is below ``stalled_ratio``
  (a learning rate far too small for this model). A single layer with small updates is usually a symptom of
  vanishing gradients and is reported there.
* Exploding updates: the median ratio is above ``exploding_update_ratio``: every step rewrites the weights, the
  first sign of a learning rate far too high, steps before the gradients blow up or the units die. Evidence,
  not a failure kind of its own: the reasoning attaches it to the failure it causes.

A model whose fit has converged (see :class:`~neuraldbg.detectors.base.FitProgress`), or whose gradients fell
a hundredfold from their first values (a stationary point: a noisy regression at its least-squares optimum keeps
a loss well above 0, but its gradients go to 0), makes small updates because it has little left to learn: that
is the fit, not a stall. When no parameter moves at all and the optimizers hold them with learning rate 0 (a
learning-rate schedule that reached 0), that is one global stall, not every parameter frozen. Parameters that
no optimizer holds stay frozen even then: a backbone frozen on purpose (``requires_grad=False``) beside a head
left out of the optimizer moves nothing, yet its fault is the head's, whatever the learning rate. When no
optimizer steps any parameter of the model and nothing moves (an optimizer built over the frozen backbone
alone, or ``optimizer.step()`` never called), every parameter with a gradient is frozen, marked
``none_stepped`` for the explanation.

A frozen parameter whose weight is all zeros (the layer's unit weight, see
:attr:`~neuraldbg.model.layers.LayerInfo.unit_weight`) is marked ``zero_weight``: its layer passes no gradient to
its input, and, frozen, never will (a zero-initialised head left out of the optimizer zeroes every gradient
upstream of it).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from ..events import EventType
from ..health import UpdateHealth
from .base import Detector, Finding, FitProgress, Observation, StepView, strength


class UpdateDetector(Detector):
    name = "update"
    event_type = EventType.UPDATE
    every_step = False

    def __init__(self) -> None:
        self._fit = FitProgress()
        self._first_gradient: float | None = None  # the largest layer gradient norm at the first observed step
        self._stepped_before: set[str] = set()  # parameters some optimizer stepped at an observed step

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
        data = view.data
        fitted, stationary = self._fit.converged(view), self._stationary(view)  # both record first readings
        converged = fitted or stationary
        if not data.update:
            return None
        obs = Observation()
        frozen_layers: set[str] = set()
        idle_layers: set[str] = set()  # layers whose optimizer did not step at this step
        for name, (delta, weight) in data.update.items():
            grad = data.grad.get(name)
            layer = view.ctx.owners.get(name)
            if grad is None or layer is None or not math.isfinite(grad):
                continue
            obs.saw(self.event_type, layer, name)
            if delta == 0.0 and grad > 0.0:
                lr = data.stepped.get(name)
                if lr is not None and lr > 0:
                    continue  # stepped with a learning rate, too small to move the weight: see stalled
                if lr is None and name in self._stepped_before:
                    idle_layers.add(layer)  # its optimizer steps on other steps
                    continue
                frozen_layers.add(layer)
                metrics = {"grad_norm": grad, "in_optimizer": float(lr is not None), "lr": lr or 0.0}
                info = view.ctx.infos.get(layer)
                if weight == 0.0 and info is not None and name == info.unit_weight:
                    metrics["zero_weight"] = 1.0  # its layer passes no gradient to its input
                obs.findings.append(
                    Finding(
                        self.event_type,
                        UpdateHealth.FROZEN.kind,
                        layer,
                        UpdateHealth.FROZEN.value,
                        metrics,
                        1.0,
                        param=name,
                    )
                )
        self._stepped_before.update(data.stepped)
        moving = [n for n, (d, _) in data.update.items() if d != 0.0 and n in data.grad]
        at_lr_zero = [f for f in obs.findings if f.metrics["in_optimizer"]]
        if at_lr_zero and not moving:
            # nothing moved, and the optimizers hold these parameters with learning rate 0: one global stall (a
            # schedule that reached 0). Parameters no optimizer holds stay frozen: their fault is their own.
            obs.findings = [f for f in obs.findings if not f.metrics["in_optimizer"]]
            metrics = {
                "median_update_ratio": 0.0,
                "max_update_ratio": 0.0,
                "lr": max(data.stepped.values(), default=0.0),
            }
            obs.saw(self.event_type, "")
            if not converged:
                obs.findings.append(self._model_finding(UpdateHealth.STALLED, metrics, 1.0))
            return obs
        if not moving and not self._stepped_before:
            # nothing moved and no optimizer has stepped any parameter of the model (an optimizer built over other
            # parameters, such as a frozen backbone's, or never stepped): no learning rate to judge
            obs.findings = [dataclasses.replace(f, metrics={**f.metrics, "none_stepped": 1.0}) for f in obs.findings]
            return obs
        grads = view.layer_gradients
        ratios = [
            u.ratio
            for layer, u in view.layer_updates.items()
            if layer not in frozen_layers
            and layer not in idle_layers
            and u.weight > 0
            and math.isfinite(u.ratio)
            and not (layer in grads and grads[layer].exact_zero)  # no gradient, no update: not the optimizer's fault
        ]
        if ratios:
            obs.saw(self.event_type, "")
            median = statistics.median(ratios)
            cfg = view.ctx.config
            lrs = [lr for lr in data.stepped.values() if lr > 0]
            metrics = {"median_update_ratio": median, "max_update_ratio": max(ratios)}
            if lrs:
                metrics["lr"] = max(lrs)
            if median < cfg.stalled_ratio and not converged:
                s = strength(median, cfg.stalled_ratio, decades=3)
                obs.findings.append(self._model_finding(UpdateHealth.STALLED, metrics, s))
            elif median > cfg.exploding_update_ratio:
                s = strength(median, cfg.exploding_update_ratio, decades=2, above=True)
                obs.findings.append(self._model_finding(UpdateHealth.EXPLODING, metrics, s))
        return obs

    def _model_finding(self, state: UpdateHealth, metrics: dict[str, float], s: float) -> Finding:
        return Finding(self.event_type, state.kind, "", state.value, metrics, s)
