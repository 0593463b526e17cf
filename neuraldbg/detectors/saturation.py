"""Saturated bounded activations: tanh, sigmoid, hardtanh, softsign, hardsigmoid pinned at their bounds.

Only hidden activations count: a final sigmoid that grows confident is what a classifier should do, and
saturation matters because it cuts the gradient to the layers *before* it. Never applied to Linear outputs
or logits.
"""

from __future__ import annotations

import math

from ..events import EventType
from ..health import ActivationHealth
from .base import Detector, Finding, Observation, StepView


class SaturationDetector(Detector):
    name = "saturation"
    event_type = EventType.ACTIVATION
    every_step = False

    def observe(self, view: StepView) -> Observation | None:
        data = view.data
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
            if fraction > threshold:
                s = (fraction - threshold) / (1 - threshold) if threshold < 1 else 1.0
                obs.findings.append(
                    Finding(
                        self.event_type,
                        ActivationHealth.SATURATED.kind,
                        key[0],
                        ActivationHealth.SATURATED.value,
                        {"saturated_fraction": fraction, "elements": float(total)},
                        max(0.0, min(1.0, s)),
                        call=key[1],
                    )
                )
        return obs
