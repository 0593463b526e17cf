"""Which steps get full statistics.

Cheap checks run on every step. Full statistics run on every step at the start of training (faults present
from step 0 are the common case; for a model of more than ``dense_modules`` modules, on every ``dense_stride``-th
step of that phase, since a full step's cost grows with the number of modules), then every ``early_every``
steps until ``early_steps``, then every ``full_every`` steps, and on every step of a window after a trigger (a
learning-rate change, a non-finite value, a new kind of abnormal state or one first past its full threshold, a
jump of the loss's gradient; for a big model, every ``dense_stride``-th step of it), so a fault that appears
mid-run is seen at its onset rather than at the next scheduled step.
"""

from __future__ import annotations

from ..config import DebugConfig


class Schedule:
    def __init__(self, config: DebugConfig, modules: int = 0) -> None:
        self._dense = config.dense_steps
        self._stride = config.dense_stride or max(1, -(-modules // config.dense_modules))
        self._early_every = config.early_every
        self._early_steps = config.early_steps
        self._every = config.full_every
        self._window = config.trigger_window
        self._until = -1  # full observation through this step, after a trigger
        self._from = 0  # ... from this step

    def is_full(self, step: int) -> bool:
        every = self._early_every if step < self._early_steps else self._every
        dense = step < self._dense and step % self._stride == 0
        window = self._from <= step <= self._until and (step - self._from) % self._stride == 0
        return dense or step % every == 0 or window

    def trigger(self, step: int) -> None:
        """Observe every step from ``step`` for the configured window."""
        if self._window and step + self._window - 1 > self._until:
            if step > self._until:  # a new window; one that extends the current window keeps its rhythm
                self._from = step
            self._until = step + self._window - 1
