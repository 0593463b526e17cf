"""Non-finite values (inf, NaN) in the input batch, in any layer's output, or in the loss.

Checked on every step, and decisive: one occurrence is an event. (NaN compares false with everything, so a
``norm < threshold`` test would pass it silently; this detector looks for it explicitly.) Non-finite
parameter gradients are reported by the gradient detector.
"""

from __future__ import annotations

import math

from ..events import EventType, FailureKind
from ..health import ActivationHealth
from ..stats.step import StepData
from .base import Detector, Finding, Observation, StepView

_STATE = ActivationHealth.NON_FINITE.value


class NonFiniteDetector(Detector):
    name = "non_finite"
    event_type = EventType.ACTIVATION

    @staticmethod
    def clean(data: StepData) -> bool:
        """Nothing non-finite anywhere in this step's readings (the common case, checked cheaply)."""
        values = (data.input_norm, data.output_norm, data.target_grad, data.head_grad, data.loss, *data.act.values())
        return data.head_finite is not False and all(v is None or math.isfinite(v) for v in values)

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
        # the loss, or failing that the gradient it sends back: non-finite while the output is finite means the
        # loss computation made it (a NaN in the forward pass shows in the outputs first)
        head = None if data.head_finite is None else (0.0 if data.head_finite else math.nan)
        for metric, value in (
            ("loss", data.loss),
            ("loss_gradient_norm", data.target_grad),
            ("head_gradient_norm", data.head_grad),
            ("head_gradient_finite", head),
        ):
            if value is not None:
                obs.saw(EventType.LOSS, "")
                output_ok = data.output_norm is None or math.isfinite(data.output_norm)
                if not math.isfinite(value) and output_ok and not inside:
                    metrics = {metric: 0.0} if metric == "head_gradient_finite" else {metric: value}
                    obs.findings.append(self._finding(EventType.LOSS, "", metrics))
                break
        return obs

    def _finding(self, event_type: EventType, layer: str, metrics: dict[str, float], call: int = 0) -> Finding:
        return Finding(event_type, FailureKind.NON_FINITE, layer, _STATE, metrics, 1.0, call=call, decisive=True)
