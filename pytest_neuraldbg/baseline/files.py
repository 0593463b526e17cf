"""The baseline file: its JSON document, a stable dump, an atomic write, and a load that validates."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from neuraldbg.text import JSON_EXACT, cut, printable

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
    """Write ``doc`` atomically (see :mod:`neuraldbg.export.files`); returns ``"created"``, ``"updated"`` or
    ``"unchanged"`` (not rewritten). Only a regular file is replaced: another thing at ``path`` (a folder, a
    symbolic link, a device), or a folder that cannot be created, is a :class:`BaselineError` saying what is
    wrong (the caller names the file)."""
    from neuraldbg.export.files import OutputError, write_atomic

    text = dumps(doc)
    try:
        old = _read(path)
    except BaselineError:
        old = ""  # unreadable or invalid: replaced by the valid document
    if old == text:
        return "unchanged"
    try:
        write_atomic(path, text)
    except OutputError as exc:
        problem = str(exc)
        named = printable(os.fspath(Path(path))) + ": "  # the writer names the file; the caller names it its way
        raise BaselineError(problem[len(named) :] if problem.startswith(named) else problem) from None
    return "created" if old is None else "updated"


#: Largest baseline file read: 16 MiB. A baseline holds five numbers per metric and layer: a 1,000-layer model
#: writes about 400 KB. The cap bounds what a hostile or mistaken file costs to read.
MAX_BASELINE_BYTES = 16 * 1024 * 1024
#: Largest magnitude of a stored number: far beyond any gradient norm, loss or ratio, far below a float's limit.
MAX_MAGNITUDE = 1e300


def _read(path: Path) -> str | None:
    """The file's text through the trace reader's guards (regular files only, bounded); None when it is absent."""
    from neuraldbg.trace import read_text

    if not os.path.lexists(path):
        return None
    return read_text(
        os.fspath(path), MAX_BASELINE_BYTES, what="baseline", fail=BaselineError, limit_hint=" (is it a baseline?)"
    )


def read_document(path: Path) -> Any:
    """The JSON at ``path``, read through the guards (not yet checked as a baseline); None when there is no file
    (or when the file holds JSON ``null``: :func:`load` tells the two apart). Raises :class:`BaselineError`."""
    text = _read(path)
    return None if text is None else _parse(text)


def _parse(text: str) -> Any:
    """The JSON value of a baseline file's text, through the trace reader's guards; raises :class:`BaselineError`."""
    from neuraldbg.export.trace_format import UnsafeJson, guarded_loads

    try:
        return guarded_loads(text, "baseline", finite=True)
    except UnsafeJson as exc:
        problem = str(exc)
        raise BaselineError(
            f"is {problem}" if problem.startswith("not ") else f"is not a valid baseline: {problem}"
        ) from None


def load(path: Path) -> dict[str, Any] | None:
    """The baseline at ``path``, checked; None when there is no file. Raises :class:`BaselineError` (one line: what
    is wrong, where, and what was expected) for a file that is not a regular file, too large, too deeply nested,
    not JSON, or holding a number that is not finite or out of bounds."""
    text = _read(path)
    if text is None:  # no file; a file holding JSON null is no baseline either, and validate() says so
        return None
    doc = _parse(text)
    validate(doc)
    return dict(doc)


def _step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= JSON_EXACT


def _label(key: str) -> str:
    """A key of the file in a JSON path of a message: as it is when printable, else escaped; at most 60 characters."""
    return cut(key if key.isprintable() else ascii(key), 60)


def _short(value: Any) -> str:
    """A value in an error message: a repr of at most 60 characters (a file may hold anything)."""
    return cut(ascii(value), 60)


def _json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words: ``null``, ``true``, ``an array``, ``a number 3``, ``a string 'x'``."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return f"a string {_short(value)}"
    if isinstance(value, (int, float)):
        return f"a number {_short(value)}"
    return type(value).__name__  # not from a JSON file: validate() was handed another object


def _bounded(value: Any) -> bool:
    """A finite JSON number within :data:`MAX_MAGNITUDE` (a non-finite value is stored as a string)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) <= MAX_MAGNITUDE
    )


def _numbers(value: Any) -> bool:
    ok = ("nan", "inf", "-inf")
    return isinstance(value, list) and len(value) == len(POINTS) and all(_bounded(v) or v in ok for v in value)


def validate(doc: Any) -> None:
    """Raise :class:`BaselineError` saying what is wrong where (a JSON path) and what was expected."""
    if not isinstance(doc, dict):
        raise BaselineError(
            f'is not a NeuralDBG baseline: expected an object with "format": {_short(FORMAT)}, got {_json_kind(doc)}'
        )
    if doc.get("format") != FORMAT:
        got = _short(doc.get("format"))
        raise BaselineError(f'is not a NeuralDBG baseline: expected "format": {_short(FORMAT)}, got {got}')
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BaselineError(f'has no valid "version": expected {VERSION}, got {_short(version)}')
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
        where = f"runs.{_label(name)}"
        if not isinstance(run, dict):
            raise BaselineError(f"{where}: expected an object, got {type(run).__name__}")
        at = run.get("at_step")
        if not (isinstance(at, list) and len(at) == len(POINTS) and all(_step(s) for s in at)):
            raise BaselineError(f"{where}.at_step: expected a list of {len(POINTS)} step numbers, got {_short(at)}")
        layers = run.get("layers")
        if not isinstance(layers, dict):
            raise BaselineError(f"{where}.layers: expected an object of layers, got {type(layers).__name__}")
        for layer, metrics in layers.items():
            at_layer = f"{where}.layers.{_label(layer)}"
            if not isinstance(metrics, dict):
                raise BaselineError(f"{at_layer}: expected an object of metrics")
            for metric, values in metrics.items():
                if metric not in LAYER_METRICS:
                    raise BaselineError(
                        f"{at_layer}.{_label(metric)}: unknown metric; expected one of {', '.join(LAYER_METRICS)}"
                    )
                if not _numbers(values):
                    raise BaselineError(
                        f"{at_layer}.{metric}: expected a list of {len(POINTS)} numbers, got {_short(values)}"
                    )
        for metric in RUN_METRICS:
            if metric in run and not _numbers(run[metric]):
                got = _short(run[metric])
                raise BaselineError(f"{where}.{metric}: expected a list of {len(POINTS)} numbers, got {got}")
        found = run.get("verdicts")
        if not isinstance(found, list) or not all(
            isinstance(v, dict) and isinstance(v.get("kind"), str) and isinstance(v.get("layer"), str) for v in found
        ):
            expected = 'a list of {"kind": ..., "layer": ...}'
            raise BaselineError(f"{where}.verdicts: expected {expected}, got {_short(found)}")
        if not isinstance(run.get("environment"), dict):
            raise BaselineError(f"{where}.environment: expected an object")
