"""Dead units: ReLU-family units that are active on (almost) no sample of the batch.

Two sources of evidence, both per unit rather than per value (per-value definitions are what made earlier
tools alarm on healthy MNIST models):

* the output of a ReLU-family module (``nn.ReLU``, ``nn.ReLU6``, ``nn.LeakyReLU(0)``): a unit is dead on a batch
  when it is positive on at most ``dead_sample_fraction`` of the samples;
* a Linear / Conv / norm layer whose output is activated functionally (``F.relu`` in ``forward``): a unit is
  dead when its pre-activation is never positive *and* its weight row receives exactly zero gradient.

A layer is dead when at least ``dead_unit_fraction`` of its units are; its event is dated from when it first
crossed ``dead_onset_fraction`` on the way (a layer dies over a few steps).

A batch of one sample says little: a healthy unit, positive on about half of its inputs, is silent on it half
the time, and a narrow layer often looks 70 % dead. So a dead reading stays provisional (it dates the event but
does not confirm it) until the consecutive observed steps it held over add up to ``dead_min_observations``
observations per unit (samples, times positions for sequences and maps, which a unit must be silent on all of).
With the usual batches a single step is enough.
"""

from __future__ import annotations

import math

from ..events import EventType
from ..health import ActivationHealth
from ..stats.step import SlotKey
from .base import Detector, Finding, Observation, StepView


class DeadUnitsDetector(Detector):
    name = "dead"
    event_type = EventType.ACTIVATION
    every_step = False

    def __init__(self) -> None:
        self._held: dict[SlotKey, float] = {}  # observations per unit over the current run of dead readings

    def observe(self, view: StepView) -> Observation | None:
        data = view.data
        if not data.dead and not data.func_dead:
            return None
        threshold = view.ctx.config.dead_unit_fraction
        onset = min(threshold, view.ctx.config.dead_onset_fraction)
        obs = Observation()
        for source, counts in (("module", data.dead), ("functional", data.func_dead)):
            for key, (dead, units) in counts.items():
                norm = data.act.get(key)
                if units <= 0 or (norm is not None and not math.isfinite(norm)):
                    continue  # non-finite outputs are the non-finite detector's business
                obs.saw(self.event_type, key[0], call=key[1])
                fraction = dead / units
                per_unit = data.numel.get(key, units) / units
                held = self._held.get(key, 0.0) + per_unit if fraction >= threshold and dead > 0 else 0.0
                self._held[key] = held
                if fraction >= onset and dead > 0:
                    metrics = {"dead_fraction": fraction, "dead_units": dead, "units": float(units)}
                    if source == "functional":
                        metrics["functional"] = 1.0
                    s = (fraction - threshold) / (1 - threshold) if threshold < 1 else 1.0
                    obs.findings.append(
                        Finding(
                            self.event_type,
                            ActivationHealth.DEAD.kind,
                            key[0],
                            ActivationHealth.DEAD.value,
                            metrics,
                            max(0.0, min(1.0, s)),
                            call=key[1],
                            provisional=fraction < threshold or held < view.ctx.config.dead_min_observations,
                        )
                    )
        return obs
