"""Versioned JSON trace files: write a run's diagnosis, read it back with the same query methods.

No pickle: a trace is plain JSON, safe to open from anywhere. Non-finite numbers (which JSON cannot hold) are
written as the strings ``"inf"``, ``"-inf"`` and ``"nan"``. Reading validates every field and reports problems as
:class:`~neuraldbg.errors.TraceError` naming the file and the field.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from ..events import EventType, FailureKind, SemanticEvent
from ..history import History
from ..reasoning.hypothesis import CausalHypothesis
from ..reasoning.topology import Topology

FORMAT = "neuraldbg-trace"
VERSION = 1


def encode_float(x: float) -> float | str:
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def event_to_dict(e: SemanticEvent) -> dict[str, Any]:
    return {
        "event_type": e.event_type.value,
        "kind": e.kind.value if e.kind else None,
        "layer": e.layer,
        "param": e.param,
        "step_start": e.step_start,
        "step_end": e.step_end,
        "from_state": e.from_state,
        "to_state": e.to_state,
        "metrics": {k: encode_float(v) for k, v in e.metrics.items()},
        "confidence": e.confidence,
        **({"detail": e.detail} if e.detail else {}),
    }


def to_dict(
    events: Sequence[SemanticEvent],
    hypotheses: Sequence[CausalHypothesis],
    topo: Topology,
    meta: dict[str, Any],
    history: History,
) -> dict[str, Any]:
    index = {id(e): i for i, e in enumerate(events)}

    def ref(e: SemanticEvent) -> int:
        return index[id(e)]

    return {
        "format": FORMAT,
        "version": VERSION,
        "meta": {k: v for k, v in meta.items() if k not in ("config", "layers")},
        "config": meta.get("config", {}),
        "model": {"order": list(topo.order), "layers": meta.get("layers", [])},
        "events": [event_to_dict(e) for e in events],
        "hypotheses": [
            {
                "kind": h.kind.value,
                "confidence": h.confidence,
                "root": ref(h.root),
                "chain": [ref(e) for e in h.chain],
                "couplings": [[ref(c.cause), ref(c.effect), c.relation] for c in h.couplings],
                "explanation": h.explanation,
                "suggestion": h.suggestion,
            }
            for h in hypotheses
        ],
        "history": {
            metric: {layer: [[s, encode_float(v)] for s, v in points] for layer, points in layers.items()}
            for metric, layers in history.to_json().items()
        },
    }


def write(path: str | os.PathLike[str], data: dict[str, Any]) -> str:
    """Write atomically (a temporary file renamed into place), so a crash never leaves half a trace."""
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".neuraldbg-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, allow_nan=False)
            fh.write("\n")
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


# --- reading -----------------------------------------------------------------------------------------


class _Reader:
    """Validates a parsed trace, raising TraceError with the file name and the JSON path of the problem."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str) -> None:
        from ..errors import TraceError

        raise TraceError(f"{self.source}: {where}: {problem}")

    def get(self, obj: Any, key: str, kind: type | tuple[type, ...], where: str, optional: bool = False) -> Any:
        if not isinstance(obj, dict):
            self.fail(where, f"expected an object, got {type(obj).__name__}")
        if key not in obj:
            if optional:
                return None
            self.fail(f"{where}.{key}" if where else key, "missing")
        value = obj[key]
        if optional and value is None:
            return None
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind is int and isinstance(value, bool):
            self.fail(f"{where}.{key}", f"expected an integer, got {value!r}")
        if not isinstance(value, kind):
            name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.fail(
                f"{where}.{key}" if where else key,
                f"expected {name}, got {type(value).__name__} {value!r:.60}",
            )
        return value

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if value in ("inf", "-inf", "nan"):
            return float(value)
        self.fail(where, f"expected a number, got {value!r:.60}")
        raise AssertionError  # unreachable

    def enum(self, enum: Any, value: Any, where: str) -> Any:
        try:
            return enum(value)
        except ValueError:
            allowed = ", ".join(m.value for m in enum)
            self.fail(where, f"unknown value {value!r}; expected one of: {allowed}")

    def event(self, raw: Any, where: str) -> SemanticEvent:
        metrics_raw = self.get(raw, "metrics", dict, where)
        kind_raw = self.get(raw, "kind", str, where, optional=True)
        start = self.get(raw, "step_start", int, where)
        end = self.get(raw, "step_end", int, where)
        if end < start:
            self.fail(where, f"step_end {end} is before step_start {start}")
        return SemanticEvent(
            event_type=self.enum(EventType, self.get(raw, "event_type", str, where), f"{where}.event_type"),
            kind=self.enum(FailureKind, kind_raw, f"{where}.kind") if kind_raw is not None else None,
            layer=self.get(raw, "layer", str, where),
            param=self.get(raw, "param", str, where, optional=True),
            step_start=start,
            step_end=end,
            from_state=self.get(raw, "from_state", str, where, optional=True),
            to_state=self.get(raw, "to_state", str, where),
            metrics={str(k): self.number(v, f"{where}.metrics.{k}") for k, v in metrics_raw.items()},
            confidence=self.get(raw, "confidence", float, where),
            detail=self.get(raw, "detail", str, where, optional=True) or "",
        )


def parse(text: str, source: str) -> dict[str, Any]:
    """Parse and validate trace JSON; returns the document with events decoded into SemanticEvent objects."""
    from ..errors import TraceError

    if not text.strip():
        raise TraceError(f"{source}: the file is empty; expected a NeuralDBG JSON trace")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = " (the file looks truncated)" if exc.pos >= len(text.rstrip()) - 1 else ""
        raise TraceError(
            f"{source}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}{hint}"
        ) from None
    reader = _Reader(source)
    if not isinstance(doc, dict):
        reader.fail("top level", f"expected a JSON object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        reader.fail("format", f"expected {FORMAT!r}, got {doc.get('format')!r}: not a NeuralDBG trace")
    version = reader.get(doc, "version", int, "")
    if version > VERSION:
        reader.fail(
            "version",
            f"trace version {version} was written by a newer NeuralDBG; this one reads up to {VERSION}",
        )
    if version < 1:
        reader.fail("version", f"expected a positive version, got {version}")
    raw_events = reader.get(doc, "events", list, "")
    events = [reader.event(raw, f"events[{i}]") for i, raw in enumerate(raw_events)]
    model = reader.get(doc, "model", dict, "")
    order = reader.get(model, "order", list, "model")
    layers = reader.get(model, "layers", list, "model")
    for i, layer in enumerate(layers):
        reader.get(layer, "name", str, f"model.layers[{i}]")
        reader.get(layer, "type", str, f"model.layers[{i}]")
    for i, hyp in enumerate(reader.get(doc, "hypotheses", list, "")):
        for j, idx in enumerate(reader.get(hyp, "chain", list, f"hypotheses[{i}]")):
            if not isinstance(idx, int) or not 0 <= idx < len(events):
                reader.fail(f"hypotheses[{i}].chain[{j}]", f"expected an event index below {len(events)}, got {idx!r}")
    history_raw = reader.get(doc, "history", dict, "", optional=True) or {}
    history: dict[str, dict[str, list[list[float]]]] = {}
    for metric, per_layer in history_raw.items():
        if not isinstance(per_layer, dict):
            reader.fail(f"history.{metric}", "expected an object")
        for layer, points in per_layer.items():
            where = f"history.{metric}.{layer}"
            if not isinstance(points, list):
                reader.fail(where, "expected a list of [step, value] pairs")
            history.setdefault(metric, {})[layer] = [
                [int(reader.number(p[0], where)), reader.number(p[1], where)]
                for p in points
                if isinstance(p, list) and len(p) == 2
            ]
    return {
        "meta": reader.get(doc, "meta", dict, "", optional=True) or {},
        "config": reader.get(doc, "config", dict, "", optional=True) or {},
        "order": [str(x) for x in order],
        "layers": layers,
        "events": events,
        "history": history,
    }
