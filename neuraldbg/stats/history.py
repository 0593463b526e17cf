"""Bounded time series for reports and baselines: memory stays flat however long the run.

Each :class:`Series` keeps at most ``capacity`` points. When full it drops every other point and from then on
keeps only every other point offered, so the resolution halves and the points stay evenly spread over the run.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator


class Series:
    def __init__(self, capacity: int) -> None:
        self._capacity = max(8, capacity - capacity % 2)
        self._steps = array("q")
        self._values = array("d")
        self._stride = 1
        self._offered = 0

    def add(self, step: int, value: float) -> None:
        offered = self._offered
        self._offered += 1
        if offered % self._stride:
            return
        self._steps.append(step)
        self._values.append(value)
        if len(self._steps) >= self._capacity:
            self._steps = self._steps[::2]
            self._values = self._values[::2]
            self._stride *= 2

    def __len__(self) -> int:
        return len(self._steps)

    def __iter__(self) -> Iterator[tuple[int, float]]:
        return zip(self._steps, self._values)

    def points(self) -> list[tuple[int, float]]:
        return list(zip(self._steps, self._values))

    def at(self, step: int) -> float | None:
        """The value at the recorded step nearest to ``step``."""
        if not self._steps:
            return None
        best = min(range(len(self._steps)), key=lambda i: abs(self._steps[i] - step))
        return self._values[best]


class History:
    """Named series, e.g. ``("grad_norm", "3")`` or ``("loss", "")``."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self.series: dict[tuple[str, str], Series] = {}

    def add(self, metric: str, layer: str, step: int, value: float) -> None:
        if value is None or (isinstance(value, float) and math.isnan(value) and metric != "loss"):
            return
        series = self.series.get((metric, layer))
        if series is None:
            series = self.series[(metric, layer)] = Series(self._capacity)
        series.add(step, value)

    def add_each(self, metric: str, step: int, values: Iterable[tuple[str, float]]) -> None:
        """:meth:`add` for every ``(layer, value)`` of one metric at one step (a fully observed step's reading of
        every layer: one call instead of one per layer)."""
        series, capacity, keep_nan = self.series, self._capacity, metric == "loss"
        for layer, value in values:
            if value is None or (not keep_nan and isinstance(value, float) and math.isnan(value)):
                continue
            found = series.get((metric, layer))
            if found is None:
                found = series[(metric, layer)] = Series(capacity)
            found.add(step, value)

    def get(self, metric: str, layer: str) -> Series | None:
        return self.series.get((metric, layer))

    def layers(self, metric: str) -> list[str]:
        return [layer for m, layer in self.series if m == metric]

    def to_json(self) -> dict[str, dict[str, list[list[float]]]]:
        out: dict[str, dict[str, list[list[float]]]] = {}
        for (metric, layer), series in self.series.items():
            out.setdefault(metric, {})[layer] = [[s, v] for s, v in series]
        return out

    @classmethod
    def from_json(cls, data: dict[str, dict[str, list[list[float]]]], capacity: int) -> History:
        history = cls(capacity)
        for metric, layers in data.items():
            for layer, points in layers.items():
                for step, value in points:
                    history.add(metric, layer, int(step), float(value))
        return history
