"""Anomalous activation magnitudes: a layer whose output root-mean-square exceeds ``anomalous_rms``.

Evidence rather than a failure kind of its own: it shows where an explosion runs through the forward pass,
which the reasoning uses to explain exploding gradients (see also :mod:`.gain`).
"""

from __future__ import annotations

import math

from ..events import EventType
from ..health import ActivationHealth
from .base import Detector, Finding, Observation, StepView, strength


class MagnitudeDetector(Detector):
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
                obs.findings.append(
                    Finding(
                        self.event_type,
                        None,
                        key[0],
                        ActivationHealth.ANOMALOUS.value,
                        {"output_rms": rms},
                        strength(rms, limit, decades=3, above=True),
                        call=key[1],
                    )
                )
        return obs
