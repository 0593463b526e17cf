"""A finished run as baseline data: per layer and run metric, its values at five fixed points of the run.

Imports no torch at import time (:func:`environment` imports it only for a debugger without a trace).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from neuraldbg.text import json_number

from ..records import HypothesisRecord, hypothesis_dict

#: The fixed points of a run: a label and the fraction of the way from its first to its last observed step.
POINTS: tuple[tuple[str, float], ...] = (("first", 0.0), ("25%", 0.25), ("50%", 0.5), ("75%", 0.75), ("last", 1.0))
LAYER_METRICS = ("grad_norm", "update_ratio", "dead_fraction", "saturated_fraction")
RUN_METRICS = ("loss", "loss_gradient")
SIGNIFICANT = 4  # digits kept of every value


def rounded(value: float) -> float | str:
    """4 significant digits; non-finite values as the strings ``"nan"``, ``"inf"``, ``"-inf"``."""
    value = float(value)
    if not math.isfinite(value):
        return json_number(value)
    return float(f"{value:.{SIGNIFICANT}g}")


def as_float(value: Any) -> float:
    return float(value)  # float("nan"), float("inf") read the strings back


def environment(dbg: Any, *, device: str | None = None, origin: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Where the run happened: versions (from the run's trace), the device, smoke_train's seed and steps."""
    meta: Mapping[str, Any] = {}
    try:
        meta = dbg.meta
    except Exception:  # not an engine debugger: the versions of this process
        meta = {}
    env: dict[str, Any] = {}
    for key in ("torch_version", "python_version", "neuraldbg_version"):
        if meta.get(key) is not None:
            env[key] = str(meta[key])
    if not env:
        import platform

        import torch

        import neuraldbg

        env = {
            "torch_version": str(torch.__version__),
            "python_version": platform.python_version(),
            "neuraldbg_version": str(neuraldbg.__version__),
        }
    if device is not None:
        env["device"] = device
    env.update(origin or {})
    return env


def device_of(model: Any) -> str | None:
    """The device type (``cpu``, ``cuda``, ``mps``) of the model's first parameter or buffer."""
    try:
        for tensor in [*model.parameters(), *model.buffers()]:
            return str(tensor.device.type)
    except Exception:
        return None
    return "cpu"


def targets(first: int, last: int) -> list[int]:
    """The steps of the fixed points between the first and the last observed step."""
    return [first + int((last - first) * fraction + 0.5) for _, fraction in POINTS]


@dataclass
class Observed:
    """A run summarised for the baseline, and its hypotheses as plain data (for the failure text)."""

    summary: dict[str, Any]
    hypotheses: list[HypothesisRecord] = field(default_factory=list)


def summarise(dbg: Any, env: Mapping[str, Any]) -> Observed:
    """The baseline entry of a finished run (see :mod:`pytest_neuraldbg.baseline` for what it holds)."""
    hypotheses = list(dbg.hypotheses())  # first: asking for the verdict flushes a step still buffered
    history = dbg.history
    wanted = [
        (metric, layer, series)
        for (metric, layer), series in history.series.items()
        if (metric in LAYER_METRICS or (metric in RUN_METRICS and layer == "")) and len(series)
    ]
    steps: list[int] = []
    for _, _, series in wanted:
        points = series.points()
        steps += [int(points[0][0]), int(points[-1][0])]
    at = targets(min(steps), max(steps)) if steps else [0] * len(POINTS)
    layers: dict[str, dict[str, list[float | str]]] = {}
    run: dict[str, Any] = {}
    for metric, layer, series in wanted:
        values = [rounded(series.at(step)) for step in at]
        if metric in LAYER_METRICS:
            layers.setdefault(str(layer), {})[metric] = values
        else:
            run[metric] = values
    found = sorted({(h.kind.value, str(h.root.layer)) for h in hypotheses})
    run.update(
        {
            "points": [label for label, _ in POINTS],
            "at_step": at,
            "steps_observed": int(dbg.steps),
            "model": str(dbg.model_name),
            "layers": layers,
            "verdicts": [{"kind": kind, "layer": layer} for kind, layer in found],
            "environment": dict(env),
        }
    )
    plain = json.loads(json.dumps(run, allow_nan=False))  # builtins only: TorchVersion is a str subclass
    return Observed(plain, [hypothesis_dict(h) for h in hypotheses])
