"""Which steps get full statistics.

Cheap checks run on every step. Full statistics run on every step at the start of training (faults present
from step 0 are the common case), then every ``full_every`` steps, and on every step of a window after a
trigger (a learning-rate change, a non-finite value, an activation blowing up), so a fault that appears
mid-run is seen at its onset rather than at the next scheduled step.
"""

from __future__ import annotations

from .config import DebugConfig


class Schedule:
    def __init__(self, config: DebugConfig) -> None:
        self._dense = config.dense_steps
        self._every = config.full_every
        self._window = config.trigger_window
        self._until = -1  # full observation through this step, after a trigger

    def is_full(self, step: int) -> bool:
        return step < self._dense or step % self._every == 0 or step <= self._until

    def trigger(self, step: int) -> None:
        """Observe every step from ``step`` for the configured window."""
        if self._window:
            self._until = max(self._until, step + self._window - 1)
