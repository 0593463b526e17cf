"""Which steps get full statistics.

Cheap checks run on every step. Full statistics run on every step at the start of training (faults present
from step 0 are the common case), then every ``early_every`` steps until ``early_steps``, then every
``full_every`` steps, and on every step of a window after a trigger (a learning-rate change, a non-finite value,
a new abnormal state, a jump of the loss's gradient), so a fault that appears mid-run is seen at its onset rather
than at the next scheduled step.
"""

from __future__ import annotations

from .config import DebugConfig


class Schedule:
    def __init__(self, config: DebugConfig) -> None:
        self._dense = config.dense_steps
        self._early_every = config.early_every
        self._early_steps = config.early_steps
        self._every = config.full_every
        self._window = config.trigger_window
        self._until = -1  # full observation through this step, after a trigger

    def is_full(self, step: int) -> bool:
        every = self._early_every if step < self._early_steps else self._every
        return step < self._dense or step % every == 0 or step <= self._until

    def trigger(self, step: int) -> None:
        """Observe every step from ``step`` for the configured window."""
        if self._window:
            self._until = max(self._until, step + self._window - 1)
