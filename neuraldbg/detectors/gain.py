"""Amplifying layers: a parametric layer whose output is much larger than its input.

On fully observed steps, a layer that owns parameters (not a normalisation layer, whose job is rescaling) is
amplifying when its output rms is ``amplifying_gain`` times the rms of the output just before it in forward
order (the model's input, for the first layer). Evidence rather than a failure kind of its own: present from the
first step, it localises an explosion to the layer whose weights are too large for its input.
"""

from __future__ import annotations

import math

from ..events import EventType
from .base import Detector, Finding, Observation, StepView, strength


class GainDetector(Detector):
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
                    obs.findings.append(
                        Finding(self.event_type, None, key[0], "amplifying", {"gain": gain, "output_rms": rms}, s)
                    )
            if key in data.act:
                previous = rms
        return obs
