"""The scale of each layer's output over a run, for the finding that a layer's output collapsed to nothing.

:class:`OutputScales` keeps, per layer that holds parameters (an activation's output falls with the units that
die in it, which is the dead units' story; several calls in one forward pass count as the largest), the
root-mean-square of its output on the first fully observed step that reached it (the scale it starts from: at
step 0, before any update), an evenly spread, bounded series of it over the whole run (see
:class:`~neuraldbg.stats.history.Series`), and the order in which layers first produced an output. Host floats
only, from the norms the fully observed steps already read; nothing here imports torch.
"""

from __future__ import annotations

import math

from .history import Series
from .step import StepData

#: Points kept per layer over the run.
CAPACITY = 64


class OutputScales:
    """See the module docstring."""

    def __init__(self) -> None:
        self.start: dict[str, float] = {}
        self.series: dict[str, Series] = {}
        self.order: list[str] = []  # layers in the order they first produced an output (forward order)

    def observe(self, record: StepData) -> None:
        """Take in a fully observed step's layer output norms."""
        owners = {name.rpartition(".")[0] for name in record.grad}  # layers whose parameters got a gradient
        scales: dict[str, float] = {}
        for key, norm in record.act.items():
            numel = record.numel.get(key, 0)
            if key[0] not in owners or numel <= 0 or not math.isfinite(norm):
                continue
            rms = norm / math.sqrt(numel)
            scales[key[0]] = max(scales.get(key[0], 0.0), rms)
        for layer, rms in scales.items():
            if layer not in self.start:
                self.start[layer] = rms
                self.series[layer] = Series(CAPACITY)
                self.order.append(layer)
            self.series[layer].add(record.step, rms)
