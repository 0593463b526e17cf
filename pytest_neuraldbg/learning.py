"""Did the loss fall? The statistic behind :func:`~pytest_neuraldbg.assert_learns`, and the curve it prints.

Pure functions of the loss points ``[(step, loss), ...]`` a run recorded (``dbg.history.get("loss", "")``);
imports no torch.

The statistic: the median of the first ``w`` recorded losses against the median of the last ``w``, where ``w``
is a fifth of the recorded points, at least 1 and at most :data:`MAX_WINDOW` (10 for a 50-step run). A median
ignores one noisy batch or a spike; comparing the two ends ignores how the loss got there. The run learned by
``factor`` when ``last <= first / factor``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_FACTOR = 2.0  # the loss must at least halve
MAX_WINDOW = 10  # recorded losses in each median
CURVE_POINTS = 10  # points of the loss curve shown in a failure


def window(count: int) -> int:
    """How many recorded losses each end's median takes: a fifth of them, between 1 and :data:`MAX_WINDOW`."""
    return max(1, min(MAX_WINDOW, count // 5))


@dataclass(frozen=True)
class LossDrop:
    """The two ends of a loss curve and the factor between them."""

    first: float  # median of the first ``window`` recorded losses
    last: float  # median of the last ``window`` (nan when one of them is not finite)
    window: int
    first_step: int
    last_step: int

    @property
    def fell_by(self) -> float:
        """``first / last``: 2.0 when the loss halved; nan when ``last`` is not finite, inf when it reached 0."""
        if not math.isfinite(self.last):
            return math.nan
        return math.inf if self.last == 0 else self.first / self.last

    def learned(self, factor: float) -> bool:
        return math.isfinite(self.last) and self.last <= self.first / factor


def loss_drop(points: Sequence[tuple[int, float]]) -> LossDrop:
    """Compare the two ends of ``points`` (at least two). A non-finite loss at the end makes ``last`` nan."""
    w = window(len(points))
    head = [v for _, v in points[:w] if math.isfinite(v)]
    tail = [v for _, v in points[-w:]]
    first = statistics.median(head) if head else math.nan
    last = statistics.median(tail) if all(math.isfinite(v) for v in tail) else math.nan
    return LossDrop(first, last, w, int(points[0][0]), int(points[-1][0]))


def number(x: float) -> str:
    """4 significant digits."""
    return f"{x:.4g}"


def curve(points: Sequence[tuple[int, float]], count: int = CURVE_POINTS) -> str:
    """``step: loss`` at ``count`` evenly spread recorded points, the first and the last included."""
    if len(points) > count:
        picks = sorted({round(i * (len(points) - 1) / (count - 1)) for i in range(count)})
        points = [points[i] for i in picks]
    return ", ".join(f"{int(step)}: {number(value)}" for step, value in points)


def verdict_line(drop: LossDrop, factor: float, steps: int) -> str:
    """``NeuralDBG: the loss did not fall by 2x over 50 steps: 0.6924 -> 0.6843 (fell 1.01x; ...)``."""
    how = (
        f"median of the first and the last {drop.window} recorded losses"
        if drop.window > 1
        else "first and last recorded loss"
    )
    if not math.isfinite(drop.last):
        return (
            f"NeuralDBG: the loss did not fall by {factor:g}x over {steps} steps: it became non-finite "
            f"({number(drop.first)} -> nan or inf; {how})"
        )
    moved = f"fell {drop.fell_by:.3g}x" if drop.fell_by >= 1 else f"rose {1 / drop.fell_by:.3g}x"
    return (
        f"NeuralDBG: the loss did not fall by {factor:g}x over {steps} steps: {number(drop.first)} -> "
        f"{number(drop.last)} ({moved}; {how})"
    )
