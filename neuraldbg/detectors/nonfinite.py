"""Non-finite values (inf, NaN) in the input batch, in any layer's output, or in the loss.

Checked on every step, and decisive: one occurrence is an event. (NaN compares false with everything, so a
``norm < threshold`` test would pass it silently; this detector looks for it explicitly.) Non-finite
parameter gradients are reported by the gradient detector.
"""

from __future__ import annotations

import math

from ..events import EventType, FailureKind
from ..health import ActivationHealth
from .base import Detector, Finding, Observation, StepView

_STATE = ActivationHealth.NON_FINITE.value


class NonFiniteDetector(Detector):
    name = "non_finite"
    event_type = EventType.ACTIVATION

    def observe(self, view: StepView) -> Observation | None:
        data = view.data
        obs = Observation()
        if data.input_norm is not None:
            obs.saw(EventType.INPUT, "")
            if not math.isfinite(data.input_norm):
                obs.findings.append(self._finding(EventType.INPUT, "", {"input_norm": data.input_norm}))
        inside = False
        for key, norm in data.act.items():
            obs.saw(self.event_type, key[0], call=key[1])
            if not math.isfinite(norm):
                inside = True
                finding = self._finding(EventType.ACTIVATION, key[0], {"output_norm": norm}, call=key[1])
                obs.findings.append(finding)
        if data.output_norm is not None:
            obs.saw(self.event_type, "")
            if not inside and not math.isfinite(data.output_norm):  # made by the model's own forward code
                obs.findings.append(self._finding(EventType.ACTIVATION, "", {"output_norm": data.output_norm}))
        loss_like = data.loss if data.loss is not None else data.target_grad
        if loss_like is not None:
            obs.saw(EventType.LOSS, "")
            if not math.isfinite(loss_like):
                metric = "loss" if data.loss is not None else "loss_gradient_norm"
                obs.findings.append(self._finding(EventType.LOSS, "", {metric: loss_like}))
        return obs

    def _finding(self, event_type: EventType, layer: str, metrics: dict[str, float], call: int = 0) -> Finding:
        return Finding(event_type, FailureKind.NON_FINITE, layer, _STATE, metrics, 1.0, call=call, decisive=True)
