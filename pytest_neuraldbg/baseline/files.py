"""The baseline file: its JSON document, a stable dump, an atomic write, and a load that validates."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import PluginError
from .summary import LAYER_METRICS, POINTS, RUN_METRICS

FORMAT = "pytest-neuraldbg baseline"
VERSION = 1


class BaselineError(PluginError, ValueError):
    """A baseline file that cannot be read; the message says what is wrong where (the caller names the file)."""


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
