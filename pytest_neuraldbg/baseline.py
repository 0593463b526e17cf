"""Training-health baselines: a small reviewed JSON file per test, and the comparison that gates on it.

Opt in per test with ``@pytest.mark.neuraldbg(baseline=True)`` (every run the fixture watched is compared
after the test body) or call ``neuraldbg.assert_matches_baseline(ndbg)`` (the fixture's method: it needs the
test's identity and settings, so there is no stand-alone import). Create or refresh the files with
``pytest --neuraldbg-update-baselines``, review the diff and commit them.

Where: ``<test dir>/__neuraldbg__/<module stem>/<test name>.json``, one file per test (parametrize ids are part
of the name; a test that watches several runs keeps them by run name inside the file).

What: per run, at five fixed points of the run (the first and last observed step and the steps at 25%, 50% and
75% between them; each value is the nearest recorded point): per layer the gradient norm, update ratio
(``||dW|| / ||W||``), dead and saturated fractions; the loss and the loss-gradient norm; the verdicts (failure
kind and root layer of each hypothesis); the environment. Floats keep 4 significant digits.

How runs are compared (``compare_run``):

* verdicts exactly: a failure (kind, root layer) the baseline does not have is a regression; one that is
  gone is an improvement;
* gradient norms, update ratios and the loss-gradient norm in log space: a change by more than
  ``grad_tolerance`` (a factor, default 10) either way is a regression, because neither direction is better
  in general (100x smaller is on the way to vanishing, 100x larger to exploding). When the run fixed a failure
  of its baseline (verdicts gone, none new), such changes come with the fix and are reported as ``changed``;
* dead and saturated fractions: a rise by more than ``fraction_tolerance`` (absolute, default 0.1) is a
  regression, a fall by more is an improvement;
* the loss, when both runs observed it: a rise by more than ``loss_tolerance`` (relative to the baseline's,
  default 0.25) is a regression, a fall by more is an improvement;
* a layer, metric or run present on one side only is a regression (the model changed: refresh the baseline);
* norms and ratios below ``1e-12`` count as zero (so 0 -> 1e-3 is a change, 0 -> 1e-14 is not); a non-finite
  value equals the same non-finite value, a finite value turning non-finite is a regression and the reverse
  an improvement.

A regression fails the test; improvements pass and are listed in the terminal summary. A different torch
version, device, NeuralDBG version, seed or step count warns (:class:`NeuralDbgBaselineWarning`) and the runs
are compared anyway.

Determinism: a baseline is only as good as the run is repeatable. ``smoke_train(seed=0)`` seeds, for its
loop, torch's global generator (which also drives a ``DataLoader``'s shuffling, dropout and worker seeds),
``random``, numpy and a ``DataLoader``'s own ``generator`` when it was given one. Seed yourself what happens
before it or outside it: the model's initialisation (``torch.manual_seed(0)`` right before building the
model), data you generate (a seeded ``torch.Generator``), and your own training loop when you call the fixture
directly (``torch.manual_seed`` before it, a seeded DataLoader ``generator``). On a GPU also call
``torch.use_deterministic_algorithms(True)`` (and set ``CUBLAS_WORKSPACE_CONFIG=:4096:8``) or expect small
differences between runs, which the tolerances mostly absorb.

This module imports no torch at import time.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import tempfile
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

from . import records, verdict
from .options import Settings

FORMAT = "pytest-neuraldbg baseline"
VERSION = 1
DIRECTORY = "__neuraldbg__"
UPDATE_FLAG = "--neuraldbg-update-baselines"

#: The fixed points of a run: a label and the fraction of the way from its first to its last observed step.
POINTS: tuple[tuple[str, float], ...] = (("first", 0.0), ("25%", 0.25), ("50%", 0.5), ("75%", 0.75), ("last", 1.0))
LAYER_METRICS = ("grad_norm", "update_ratio", "dead_fraction", "saturated_fraction")
RUN_METRICS = ("loss", "loss_gradient")
LOG_METRICS = frozenset({"grad_norm", "update_ratio", "loss_gradient"})
FRACTION_METRICS = frozenset({"dead_fraction", "saturated_fraction"})
#: Environment entries whose difference warns; the others (python_version) are recorded for the reader only.
CHECKED_ENVIRONMENT = ("torch_version", "device", "neuraldbg_version", "seed", "steps")
TINY = 1e-12  # a norm or ratio below this counts as zero
SIGNIFICANT = 4
MAX_ROWS = 40  # rows of a failure's table per run

REGRESSED = "regressed"
IMPROVED = "improved"
CHANGED = "changed"  # a gradient magnitude moved, together with a fixed failure


class NeuralDbgBaselineWarning(UserWarning):
    """The baseline was recorded in another environment (torch version, device, ...); compared anyway."""


class BaselineError(ValueError):
    """A baseline file that cannot be read; the message says what is wrong where (the caller names the file)."""


# --- names and places ----------------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._\-\[\]=+,@]+")
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)), *(f"lpt{i}" for i in range(1, 10))}
MAX_NAME = 120


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8"), usedforsecurity=False).hexdigest()[:8]


def file_name(test_id: str) -> str:
    """The baseline file name of a test: ``TestA::test_b[x-1]`` -> ``TestA.test_b[x-1].json``.

    Letters, digits and ``. _ - [ ] = + , @`` are kept; anything else becomes ``_`` and the name then ends
    with a hash of the test id, so that ``test[a/b]`` and ``test[a_b]`` stay distinct. Long names are cut
    (and hashed); Windows device names get a leading ``_``.
    """
    name = test_id.replace("::", ".")
    safe = _UNSAFE.sub("_", name).strip(". ") or "test"
    if safe != name or len(safe) > MAX_NAME:
        safe = safe[: MAX_NAME - 9].rstrip("._-") + "-" + _digest(test_id)
    if safe.split(".", 1)[0].lower() in _RESERVED:
        safe = "_" + safe
    return safe + ".json"


def locate(item: pytest.Item) -> tuple[Path, str]:
    """The test module's path and the test's id inside it: ``TestA::test_b[x-1]``."""
    module = item.getparent(pytest.Module)
    if module is not None and item.nodeid.startswith(module.nodeid + "::"):
        return module.path, item.nodeid[len(module.nodeid) + 2 :]
    return item.path, item.name


def directory_for(module: Path) -> Path:
    """``tests/test_x.py`` -> ``tests/__neuraldbg__/test_x``."""
    return module.parent / DIRECTORY / module.stem


def path_for(module: Path, test_id: str) -> Path:
    return directory_for(module) / file_name(test_id)


def shown(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` when below it (posix separators), else absolute."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


# --- a run as baseline data ----------------------------------------------------------------------------------


def rounded(value: float) -> float | str:
    """4 significant digits; non-finite values as the strings ``"nan"``, ``"inf"``, ``"-inf"``."""
    value = float(value)
    if not math.isfinite(value):
        return records.number(value)
    return float(f"{value:.{SIGNIFICANT}g}")


def as_float(value: Any) -> float:
    return float(value)  # float("nan"), float("inf") read the strings back


def environment(dbg: Any, *, device: str | None = None, origin: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Where the run happened: versions (from the run's trace), the device, smoke_train's seed and steps."""
    meta: Mapping[str, Any] = {}
    try:
        meta = dbg.to_dict().get("meta", {})
    except Exception:  # a debugger without a trace: the versions of this process
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
    hypotheses: list[dict[str, Any]] = field(default_factory=list)


def summarise(dbg: Any, env: Mapping[str, Any]) -> Observed:
    """The baseline entry of a finished run (see the module docstring for what it holds)."""
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
    return Observed(plain, [records.hypothesis_dict(h) for h in hypotheses])


# --- the file --------------------------------------------------------------------------------------------------


def document(test_id: str, runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "test": test_id, "runs": {str(k): dict(v) for k, v in runs.items()}}


def dumps(value: Any) -> str:
    """Pretty JSON with sorted keys; lists and dicts of plain values stay on one line when short."""
    return _dump(value, 0) + "\n"


def _dump(value: Any, depth: int) -> str:
    if isinstance(value, Mapping):
        items = sorted(value.items())
        flat = all(not isinstance(v, (Mapping, list)) for _, v in items)
        inline = "{" + ", ".join(f"{json.dumps(str(k))}: {json.dumps(v, allow_nan=False)}" for k, v in items) + "}"
        if not items or (flat and len(inline) <= 80 and depth > 0 and len(items) <= 3):
            return inline
        pad = "  " * (depth + 1)
        body = ",\n".join(f"{pad}{json.dumps(str(k))}: {_dump(v, depth + 1)}" for k, v in items)
        return "{\n" + body + "\n" + "  " * depth + "}"
    if isinstance(value, list):
        if all(not isinstance(v, (Mapping, list)) for v in value):
            return "[" + ", ".join(json.dumps(v, allow_nan=False) for v in value) + "]"
        pad = "  " * (depth + 1)
        return "[\n" + ",\n".join(pad + _dump(v, depth + 1) for v in value) + "\n" + "  " * depth + "]"
    return json.dumps(value, allow_nan=False)


def write(path: Path, doc: Mapping[str, Any]) -> str:
    """Write ``doc`` atomically; returns ``"created"``, ``"updated"`` or ``"unchanged"`` (not rewritten)."""
    text = dumps(doc)
    try:
        old = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        old = None
    if old == text:
        return "unchanged"
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return "created" if old is None else "updated"


def load(path: Path) -> dict[str, Any] | None:
    """The baseline at ``path``, checked; None when there is no file. Raises :class:`BaselineError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"cannot be read: {exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"is not valid JSON: {exc}") from None
    validate(doc)
    return dict(doc)


def _numbers(value: Any) -> bool:
    ok = ("nan", "inf", "-inf")
    return (
        isinstance(value, list)
        and len(value) == len(POINTS)
        and all((isinstance(v, (int, float)) and not isinstance(v, bool)) or v in ok for v in value)
    )


def validate(doc: Any) -> None:
    """Raise :class:`BaselineError` saying what is wrong where (a JSON path) and what was expected."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise BaselineError(f'is not a NeuralDBG baseline: expected "format": {FORMAT!r}, got {got!r}')
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BaselineError(f'has no valid "version": expected {VERSION}, got {version!r}')
    if version > VERSION:
        raise BaselineError(
            f"was written by a newer pytest-neuraldbg (format version {version}; this one reads {VERSION}): "
            "upgrade pytest-neuraldbg"
        )
    if version != VERSION:
        raise BaselineError(f"has format version {version}, which this pytest-neuraldbg cannot read ({VERSION})")
    runs = doc.get("runs")
    if not isinstance(runs, dict):
        raise BaselineError(f"runs: expected an object of runs by name, got {type(runs).__name__}")
    for name, run in runs.items():
        where = f"runs.{name}"
        if not isinstance(run, dict):
            raise BaselineError(f"{where}: expected an object, got {type(run).__name__}")
        at = run.get("at_step")
        if not (isinstance(at, list) and len(at) == len(POINTS) and all(isinstance(s, int) for s in at)):
            raise BaselineError(f"{where}.at_step: expected a list of {len(POINTS)} step numbers, got {at!r}")
        layers = run.get("layers")
        if not isinstance(layers, dict):
            raise BaselineError(f"{where}.layers: expected an object of layers, got {type(layers).__name__}")
        for layer, metrics in layers.items():
            if not isinstance(metrics, dict):
                raise BaselineError(f"{where}.layers.{layer}: expected an object of metrics")
            for metric, values in metrics.items():
                if metric not in LAYER_METRICS:
                    raise BaselineError(
                        f"{where}.layers.{layer}.{metric}: unknown metric; expected one of {', '.join(LAYER_METRICS)}"
                    )
                if not _numbers(values):
                    raise BaselineError(
                        f"{where}.layers.{layer}.{metric}: expected a list of {len(POINTS)} numbers, got {values!r}"
                    )
        for metric in RUN_METRICS:
            if metric in run and not _numbers(run[metric]):
                raise BaselineError(f"{where}.{metric}: expected a list of {len(POINTS)} numbers, got {run[metric]!r}")
        found = run.get("verdicts")
        if not isinstance(found, list) or not all(
            isinstance(v, dict) and isinstance(v.get("kind"), str) and isinstance(v.get("layer"), str) for v in found
        ):
            raise BaselineError(f'{where}.verdicts: expected a list of {{"kind": ..., "layer": ...}}, got {found!r}')
        if not isinstance(run.get("environment"), dict):
            raise BaselineError(f"{where}.environment: expected an object")


# --- comparing --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerances:
    """How far a run may drift from its baseline: see the module docstring."""

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


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return f"{float(value):.{SIGNIFICANT}g}"


def judge(metric: str, base: Any, now: Any, tolerances: Tolerances) -> str | None:
    """None when ``now`` is within tolerance of ``base``; else REGRESSED or IMPROVED (see the module docstring)."""
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
            out.rows.append(Row(metric, layer, label, _show(b), _show(n), tolerances.text(metric), change, phrase))

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
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


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


# --- texts ----------------------------------------------------------------------------------------------------


def update_command(nodeid: str) -> str:
    return f"pytest {UPDATE_FLAG} {shlex.quote(nodeid)}"


def missing_text(path: str, nodeid: str) -> str:
    return (
        f"NeuralDBG baseline missing: {path} does not exist\n\n"
        f"Create it by running the test with {UPDATE_FLAG}, then review and commit the file:\n"
        f"  {update_command(nodeid)}"
    )


def invalid_text(path: str, nodeid: str, problem: str) -> str:
    return (
        f"NeuralDBG baseline {path} {problem}\n\n"
        f"Fix the file, or write it again from this run with {UPDATE_FLAG} and review the diff:\n"
        f"  {update_command(nodeid)}"
    )


def table(rows: Sequence[Row]) -> list[str]:
    head = ("metric", "layer", "point", "baseline", "now", "tolerance", "change")
    cells = [
        head,
        *((r.metric, r.layer or "-", r.point or "-", r.baseline, r.now, r.tolerance, r.change) for r in rows),
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]


def regression_text(
    comparisons: Sequence[RunComparison],
    problems: Sequence[str],
    *,
    path: str,
    nodeid: str,
    hypotheses: Mapping[str, list[dict[str, Any]]],
    several: bool,
) -> str:
    """The failure text: one verdict line, the file, a table per run, the engine's diagnosis, how to refresh."""
    phrases = [*problems, *(f"{_in_run(c.run, several)}{r.what}" for c in comparisons for r in c.regressions)]
    first = f"NeuralDBG baseline regression: {phrases[0]}"
    if len(phrases) > 1:
        first += f"; +{len(phrases) - 1} more"
    lines = [verdict.short(first, verdict.MAX_HEADLINE), "", f"Baseline: {path}"]
    lines += [f"  {p}" for p in problems]
    for c in comparisons:
        if not c.rows:
            continue
        shown_rows = c.rows[:MAX_ROWS]
        lines += ["", f"run {c.run}:" if several else "Differences beyond tolerance:", *table(shown_rows)]
        if len(c.rows) > MAX_ROWS:
            lines.append(f"... and {len(c.rows) - MAX_ROWS} more differences")
    for c in comparisons:
        found = hypotheses.get(c.run) or []
        if c.regressions and found:
            label = f" of run {c.run}" if several else ""
            lines += ["", verdict.headline(found, f"NeuralDBG's diagnosis{label}: training is unhealthy")]
            lines += [verdict.describe(h, i if len(found) > 1 else None) for i, h in enumerate(found, 1)]
    lines += ["", "If the change is intended, refresh the baseline and commit it:", f"  {update_command(nodeid)}"]
    return "\n".join(lines)


def grouped(rows: Sequence[Row]) -> list[str]:
    """One phrase per metric and layer (its first point, and how many more): verdicts, improved, changed."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.metric, row.layer, row.change), []).append(row)
    rank = {"verdict": 0, IMPROVED: 1, REGRESSED: 1, CHANGED: 2}
    ordered = sorted(groups.values(), key=lambda g: rank["verdict"] if g[0].metric == "verdict" else rank[g[0].change])
    more = {1: "", 2: " (+1 more point)"}
    return [g[0].what + more.get(len(g), f" (+{len(g) - 1} more points)") for g in ordered]


def _in_run(run: str, several: bool) -> str:
    return f"run {run}: " if several else ""


def environment_text(path: str, differences: Sequence[str]) -> str:
    return (
        f"NeuralDBG baseline {path} was recorded in another environment ({'; '.join(differences)}); "
        f"training statistics may differ. Compared anyway; if this environment is the reference now, "
        f"refresh it with {UPDATE_FLAG}."
    )


# --- one test's baseline ------------------------------------------------------------------------------------


class BaselineCheck:
    """The baseline of one test: compares runs with its file, or collects them to write it.

    ``notes`` are plain dictionaries for the terminal summary (they travel to the xdist controller on the
    test's report): ``{"nodeid", "path", "status", "lines"}`` with status ``matched``, ``improved``,
    ``regressed``, ``missing``, ``invalid``, ``created``, ``updated``, ``unchanged`` or ``not written``.
    """

    def __init__(
        self,
        *,
        path: Path,
        shown_path: str,
        nodeid: str,
        test_id: str,
        settings: Settings,
        location: tuple[str, int] | None = None,
    ) -> None:
        self.path = path
        self.location = location  # (file, line) of the test, for warnings raised after its body
        self.shown_path = shown_path
        self.nodeid = nodeid
        self.test_id = test_id
        self.settings = settings
        self.pending: dict[str, dict[str, Any]] = {}
        self.compared: set[str] = set()
        self.notes: list[dict[str, Any]] = []

    @property
    def updating(self) -> bool:
        return bool(self.settings.update_baselines)

    def _note(self, status: str, lines: Iterable[str] = ()) -> None:
        self.notes.append({"nodeid": self.nodeid, "path": self.shown_path, "status": status, "lines": list(lines)})

    def check(self, observed: Mapping[str, Observed], *, complete: bool, fail: Callable[[str], NoReturn]) -> None:
        """Compare ``observed`` runs with the file (or keep them for writing when updating).

        ``complete``: these are all the runs of the test, so runs in the file that were not observed are
        missing. ``fail`` raises the test's failure with the text it is given.
        """
        __tracebackhide__ = True
        self.compared.update(observed)
        if self.updating:
            self.pending.update({name: o.summary for name, o in observed.items()})
            return
        try:
            doc, problem = load(self.path), ""
        except BaselineError as exc:
            doc, problem = None, str(exc)
        if problem:  # failed outside the except block: the reader's error is no part of the test's failure
            self._note("invalid", [problem])
            fail(invalid_text(self.shown_path, self.nodeid, problem))
        if doc is None:
            if not observed:  # nothing watched and nothing stored: nothing to compare
                return
            self._note("missing")
            fail(missing_text(self.shown_path, self.nodeid))
        stored: dict[str, Any] = doc["runs"]
        several = len(set(stored) | set(observed) | self.compared) > 1
        problems: list[str] = []
        comparisons: list[RunComparison] = []
        for name, run in observed.items():
            if name not in stored:
                problems.append(
                    f"run {name!r} has no baseline in this file (runs there: {', '.join(stored) or 'none'})"
                )
                continue
            comparisons.append(compare_run(name, stored[name], run.summary, Tolerances.of(self.settings)))
        if complete:
            problems += [
                f"run {name!r} is in the baseline but the test did not watch it"
                for name in stored
                if name not in self.compared
            ]
        differences = [f"{_in_run(c.run, several)}{d}" for c in comparisons for d in c.environment]
        if differences:
            warning = NeuralDbgBaselineWarning(environment_text(self.shown_path, differences))
            if self.location is not None and complete:  # after the test body: point at the test, not the plugin
                warnings.warn_explicit(warning, NeuralDbgBaselineWarning, *self.location)
            else:
                warnings.warn(warning, stacklevel=3)  # at the assert_matches_baseline() call
        regressions = [r for c in comparisons for r in c.regressions]
        improvements = [f"{_in_run(c.run, several)}{line}" for c in comparisons for line in grouped(c.improvements)]
        if problems or regressions:
            self._note("regressed", [*problems, *(r.what for r in regressions)])
            fail(
                regression_text(
                    comparisons,
                    problems,
                    path=self.shown_path,
                    nodeid=self.nodeid,
                    hypotheses={name: o.hypotheses for name, o in observed.items()},
                    several=several,
                )
            )
        self._note("improved" if improvements else "matched", improvements)

    def finish(self, passed: bool, due: bool = False) -> None:
        """At the end of the test body: write the collected runs when updating (only if the test passed).

        ``due``: runs were to be written although none was collected (``baseline=True`` and a failed body).
        """
        if not self.updating or not (self.pending or due):
            return
        if not passed:
            self._note("not written", ["the test did not pass"])
        else:
            self._note(write(self.path, document(self.test_id, self.pending)))
        self.pending = {}


# --- stale files ---------------------------------------------------------------------------------------------


def stale_files(tests: Iterable[tuple[Path, str]], partial: Callable[[Path], bool]) -> list[tuple[Path, str]]:
    """Baseline files of the collected modules that no collected (or deselected) test of theirs would use.

    ``tests``: ``(module path, test id)`` of every collected and every deselected test. ``partial``: whether
    a module was only partly collected (``test_x.py::test_y`` on the command line); those are skipped.
    Returns ``(file, test id it was written for)``, in file order.
    """
    names: dict[Path, set[str]] = {}
    for module, test_id in tests:
        names.setdefault(module, set()).add(file_name(test_id))
    out: list[tuple[Path, str]] = []
    for module in sorted(names):
        directory = directory_for(module)
        if partial(module) or not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.json")):
            if path.name not in names[module]:
                out.append((path, _written_for(path)))
    return out


def _written_for(path: Path) -> str:
    """The test id stored in the file when it matches the file's name (not a copy); else the name's stem."""
    try:
        test = json.loads(path.read_text(encoding="utf-8")).get("test")
    except (OSError, ValueError, AttributeError):
        test = None
    return test if isinstance(test, str) and file_name(test) == path.name else path.stem
