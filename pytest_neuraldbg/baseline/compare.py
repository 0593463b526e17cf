"""Comparing a run with its baseline entry: tolerances, one row per difference, and what each one means."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..options import Settings
from .summary import LAYER_METRICS, POINTS, RUN_METRICS, SIGNIFICANT, as_float

LOG_METRICS = frozenset({"grad_norm", "update_ratio", "loss_gradient"})
FRACTION_METRICS = frozenset({"dead_fraction", "saturated_fraction"})
#: Environment entries whose difference warns; the others (python_version) are recorded for the reader only.
CHECKED_ENVIRONMENT = ("torch_version", "device", "neuraldbg_version", "seed", "steps")
TINY = 1e-12  # a norm or ratio below this counts as zero

REGRESSED = "regressed"
IMPROVED = "improved"
CHANGED = "changed"  # a gradient magnitude moved, together with a fixed failure


@dataclass(frozen=True)
class Tolerances:
    """How far a run may drift from its baseline: see :mod:`pytest_neuraldbg.baseline`."""

    grad: float = 10.0  # factor, either way
    fraction: float = 0.1  # absolute rise of a dead or saturated fraction
    loss: float = 0.25  # relative rise of the loss

    @classmethod
    def of(cls, settings: Settings) -> Tolerances:
        return cls(settings.grad_tolerance, settings.fraction_tolerance, settings.loss_tolerance)

    def text(self, metric: str) -> str:
        if metric in LOG_METRICS:
            return f"x{self.grad:g}"
        if metric in FRACTION_METRICS:
            return f"+{self.fraction:g}"
        if metric == "loss":
            return f"+{self.loss * 100:g}%"
        return "exact"


@dataclass(frozen=True)
class Row:
    """One difference: which metric, where, the two values, the tolerance, and what it means."""

    metric: str
    layer: str
    point: str
    baseline: str
    now: str
    tolerance: str
    change: str  # REGRESSED, IMPROVED or CHANGED
    what: str  # a phrase for one-line verdicts: "grad_norm at '0' 101x smaller at first (step 0)"
    severity: float = math.inf  # how far beyond its tolerance, in tolerances (2: twice as far as allowed)


@dataclass
class RunComparison:
    run: str
    rows: list[Row] = field(default_factory=list)
    environment: list[str] = field(default_factory=list)  # "torch_version 2.12.0 -> 2.13.0"

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.change == REGRESSED]

    @property
    def improvements(self) -> list[Row]:
        return [r for r in self.rows if r.change != REGRESSED]

    @property
    def worst_regressions(self) -> list[Row]:
        """The regressions, worst first (new failures, then by :func:`severity`); ties keep the layer order."""
        return sorted(self.regressions, key=lambda r: (r.metric != "verdict", -r.severity))


def worst_per_group(rows: Sequence[Row]) -> list[Row]:
    """The worst row of each metric and layer (``rows`` worst first), in that order."""
    seen: set[tuple[str, str]] = set()
    out = []
    for row in rows:
        if (row.metric, row.layer) not in seen:
            seen.add((row.metric, row.layer))
            out.append(row)
    return out


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return f"{float(value):.{SIGNIFICANT}g}"


def judge(metric: str, base: Any, now: Any, tolerances: Tolerances) -> str | None:
    """None when ``now`` is within tolerance of ``base``; else REGRESSED or IMPROVED.

    The rules are listed in :mod:`pytest_neuraldbg.baseline`.
    """
    b, n = as_float(base), as_float(now)
    if not (math.isfinite(b) and math.isfinite(n)):
        if (math.isnan(b) and math.isnan(n)) or b == n:
            return None
        return IMPROVED if math.isfinite(n) else REGRESSED
    if metric in LOG_METRICS:
        shift = abs(math.log10(max(abs(n), TINY)) - math.log10(max(abs(b), TINY)))
        return None if shift <= math.log10(tolerances.grad) + 1e-9 else REGRESSED
    if metric in FRACTION_METRICS:
        if abs(n - b) <= tolerances.fraction + 1e-9:
            return None
        return REGRESSED if n > b else IMPROVED
    if n == b:
        return None
    relative = abs(n - b) / abs(b) if b != 0 else math.inf
    if relative <= tolerances.loss + 1e-9:
        return None
    return REGRESSED if n > b else IMPROVED


def severity(metric: str, base: Any, now: Any, tolerances: Tolerances) -> float:
    """How far ``now`` is from ``base``, measured in tolerances, so that differences of different metrics rank
    together: 1 at the tolerance, 2 at twice it (a 100x change of a gradient norm under a factor-10 tolerance).
    A change to or from a non-finite value is infinitely severe."""
    b, n = as_float(base), as_float(now)
    if not (math.isfinite(b) and math.isfinite(n)):
        return math.inf
    if metric in LOG_METRICS:
        shift = abs(math.log10(max(abs(n), TINY)) - math.log10(max(abs(b), TINY)))
        allowed = math.log10(tolerances.grad)
    elif metric in FRACTION_METRICS:
        shift, allowed = abs(n - b), tolerances.fraction
    else:
        shift = abs(n - b) / abs(b) if b != 0 else math.inf
        allowed = tolerances.loss
    return shift / allowed if allowed > 0 else math.inf


def _phrase(metric: str, layer: str, point: str, base: Any, now: Any) -> str:
    where = f"{metric} at '{layer}'" if layer else metric
    b, n = as_float(base), as_float(now)
    if math.isfinite(b) and math.isfinite(n) and metric in LOG_METRICS and min(abs(b), abs(n)) > TINY:
        small, large = sorted((abs(b), abs(n)))
        direction = "smaller" if abs(n) < abs(b) else "larger"
        return f"{where} {large / small:.3g}x {direction} at {point} ({_show(base)} -> {_show(now)})"
    return f"{where} {_show(base)} -> {_show(now)} at {point}"


def compare_run(name: str, base: Mapping[str, Any], now: Mapping[str, Any], tolerances: Tolerances) -> RunComparison:
    """Compare one run with its baseline entry (both as written by :func:`summarise`)."""
    out = RunComparison(name)
    had = {(v["kind"], v["layer"]) for v in base["verdicts"]}
    has = {(v["kind"], v["layer"]) for v in now["verdicts"]}
    for kind, layer in sorted(has - had):
        out.rows.append(Row("verdict", layer, "", "-", kind, "exact", REGRESSED, f"new failure {kind} at '{layer}'"))
    for kind, layer in sorted(had - has):
        out.rows.append(Row("verdict", layer, "", kind, "-", "exact", IMPROVED, f"failure {kind} at '{layer}' gone"))
    fixed = bool(had - has) and not (has - had)
    labels = [f"{label} (step {step})" for (label, _), step in zip(POINTS, now["at_step"])]

    def values(metric: str, layer: str, old: Sequence[Any] | None, new: Sequence[Any] | None) -> None:
        where = f"'{layer}'" if layer else "the run"
        if old is None or new is None:
            missing = f"{metric} at {where} is {'not in the baseline' if old is None else 'no longer recorded'}"
            shown_old = "-" if old is None else _show(old[0])
            shown_new = "-" if new is None else _show(new[0])
            out.rows.append(Row(metric, layer, "", shown_old, shown_new, "-", REGRESSED, missing))
            return
        for label, b, n in zip(labels, old, new):
            change = judge(metric, b, n, tolerances)
            if change is None:
                continue
            if change == REGRESSED and fixed and metric in LOG_METRICS:
                change = CHANGED
            phrase = _phrase(metric, layer, label, b, n)
            how_far = severity(metric, b, n, tolerances)
            out.rows.append(
                Row(metric, layer, label, _show(b), _show(n), tolerances.text(metric), change, phrase, how_far)
            )

    old_layers, new_layers = base["layers"], now["layers"]
    for layer in sorted(set(old_layers) | set(new_layers), key=_natural):
        old_metrics, new_metrics = old_layers.get(layer, {}), new_layers.get(layer, {})
        for metric in LAYER_METRICS:
            if metric in old_metrics or metric in new_metrics:
                values(metric, layer, old_metrics.get(metric), new_metrics.get(metric))
    for metric in RUN_METRICS:
        if metric in base and metric in now:  # the loss is optional: compared when both runs observed it
            values(metric, "", base[metric], now[metric])
    out.environment = environment_differences(base, now)
    return out


def _natural(name: str) -> tuple[Any, ...]:
    """Sort key: runs of ASCII digits as numbers (``'fc2'`` before ``'fc10'``); every other character, ``'²'`` or
    ``'٣'`` included, as text (``str.isdigit`` is true for ``'²'``, which ``int`` refuses)."""
    return tuple(int(p) if i % 2 else p for i, p in enumerate(re.split(r"([0-9]+)", name)))


def environment_differences(base: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    old, new = base.get("environment", {}), now.get("environment", {})
    out = [
        f"{key} {old[key]} -> {new[key]}"
        for key in CHECKED_ENVIRONMENT
        if key in old and key in new and old[key] != new[key]
    ]
    if "steps" not in old or "steps" not in new:
        before, after = base.get("steps_observed"), now.get("steps_observed")
        if before is not None and after is not None and before != after:
            out.append(f"steps_observed {before} -> {after}")
    return out
