"""Versioned JSON trace files: write a run's diagnosis, read it back with the same query methods.

No pickle: a trace is plain JSON, safe to open from anywhere. Non-finite numbers (which JSON cannot hold) are
written as the strings ``"inf"``, ``"-inf"`` and ``"nan"``.

Reading treats the text as hostile: the nesting depth is measured before parsing (without recursion); number
literals must be short and finite (non-finite values are the strings above); every field a
:class:`~neuraldbg.Trace` later reads is checked for its type and range (integer steps from 0, confidences in
[0, 1], counts finite). Every problem is one :class:`~neuraldbg.errors.TraceError` line naming the file, the JSON
path of the field and what was expected, so that a trace that loads answers every query, and saves again.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import re
from collections.abc import Sequence
from math import isfinite as _finite
from typing import Any, NoReturn

from ..config import DebugConfig
from ..errors import ConfigError, TraceError
from ..events import EventType, FailureKind, SemanticEvent
from ..health import HealthState, state_of
from ..kinds import registry
from ..reasoning.hypothesis import CausalHypothesis
from ..reasoning.topology import Topology
from ..stats.history import History
from ..text import JSON_EXACT, json_number, printable
from .files import write_atomic

FORMAT = "neuraldbg-trace"
VERSION = 1


def event_to_dict(e: SemanticEvent) -> dict[str, Any]:
    return {
        "event_type": e.event_type.value,
        "kind": e.kind.value if e.kind else None,
        "layer": e.layer,
        "param": e.param,
        "step_start": e.step_start,
        "step_end": e.step_end,
        "from_state": None if e.from_state is None else str(e.from_state),
        "to_state": str(e.to_state),
        "metrics": {k: json_number(v) for k, v in e.metrics.items()},
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
        "model": {
            "order": list(topo.order),
            "calls": [[layer, call, position] for (layer, call), position in topo.calls.items()],
            "layers": meta.get("layers", []),
        },
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
            metric: {layer: [[s, json_number(v)] for s, v in points] for layer, points in layers.items()}
            for metric, layers in history.to_json().items()
        },
    }


def write(path: str | os.PathLike[str], data: dict[str, Any]) -> str:
    """Write atomically (see :mod:`neuraldbg.export.files`), so a crash never leaves half a trace; only a regular file
    is replaced (a device, a FIFO or a symbolic link is refused with :class:`~neuraldbg.export.files.OutputError`)."""
    text = io.StringIO()
    json.dump(data, text, indent=1, allow_nan=False)
    text.write("\n")
    write_atomic(path, text.getvalue())
    return os.fspath(path)


# --- reading -----------------------------------------------------------------------------------------

#: Deepest JSON nesting accepted. A trace nests 5 levels (history -> metric -> layer -> points -> point); the rest
#: is room for fields added later. Measured before parsing: Python's JSON parser recurses in C, and a document
#: nested 100,000 deep would exhaust the stack (a RecursionError, or a crash where the recursion limit is raised).
MAX_DEPTH = 64
#: Largest step (and count) accepted: 2**53 - 1, the largest integer every JSON reader holds exactly.
MAX_STEP = JSON_EXACT
#: Longest run of digits accepted in a number (floats as written have at most 21; Python parses integers in
#: quadratic time, and refuses more than 4300 digits with a message about its internals).
MAX_DIGITS = 24

#: Metrics read as counts or positions whatever the kind: the call index (each kind adds its own counts).
_COUNT_METRICS = frozenset({"call"})

#: What ``meta`` may say, and how it is checked (other keys pass through untouched).
_META_INTS = {"steps_observed": 0, "losses_recorded": 0, "full_steps": 0, "last_step": -1, "events_dropped": 0}
_META_TEXT = ("model", "step_mode", "torch_version", "python_version", "neuraldbg_version")
_META_OPTIONAL = {"rank": 0, "world_size": 1}  # null when the run was not distributed

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEEP_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class _BadNumber(Exception):
    """A number literal no trace holds (raised from inside json.loads, reported as a TraceError)."""


def _parse_constant(name: str) -> float:
    raise _BadNumber(
        f'a bare {name}, which is not JSON; NeuralDBG writes non-finite numbers as the strings "inf", "-inf", "nan"'
    )


_DIGITS_ONLY = bytes(ord("0") if 48 <= b <= 57 else ord(" ") for b in range(256))  # 0-9 -> 0, others -> space


def outside_strings(text: str) -> bytes:
    """JSON text with every string literal removed (escaped backslashes and quotes first, then split on quotes)."""
    unescaped = text.replace("\\\\", "").replace('\\"', "")
    return "".join(unescaped.split('"')[0::2]).encode("utf-8", "surrogatepass")


def nesting_depth(structure: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text outside strings, without recursion. Linear, in C."""
    brackets = structure.translate(None, _KEEP_BRACKETS)
    return max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def longest_digit_run_exceeds(structure: bytes, limit: int) -> bool:
    """Whether JSON text outside strings holds more than ``limit`` digits in a row. Linear, in C."""
    return b"0" * (limit + 1) in structure.translate(_DIGITS_ONLY)


def _non_finite(value: Any) -> str | None:
    """The JSON path (relative to ``value``) of a non-finite float inside it, if any; iterative, not recursive."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return where
        if isinstance(node, dict):
            stack.extend((v, f"{where}{_key(str(k))}") for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(node))
    return None


def _key(key: str) -> str:
    if _IDENT.fullmatch(key):
        return f".{key}"
    shown = key if len(key) <= 60 else key[:57] + "..."
    return "[" + json.dumps(shown) + "]"


def _shown(value: Any) -> str:
    """A value in an error message: its JSON type and a short repr, on one line."""
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    name = "null" if value is None else kind.get(type(value), type(value).__name__)
    if isinstance(value, (list, dict)):
        return f"{name} of {len(value)}"
    return f"{name} {_short(value)}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Reader:
    """Checks a parsed trace, raising TraceError with the file name and the JSON path of the problem."""

    def __init__(self, source: str) -> None:
        self.source = printable(source)

    def fail(self, where: str, problem: str) -> NoReturn:
        raise TraceError(f"{self.source}: {where.lstrip('.') or 'top level'}: {problem}")

    def obj(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, f"expected an object, got {_shown(value)}")
        return value

    def seq(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            self.fail(where, f"expected an array, got {_shown(value)}")
        return value

    def field(self, obj: dict[str, Any], key: str, where: str) -> Any:
        if key not in obj:
            self.fail(where + _key(key), "missing")
        return obj[key]

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            self.fail(where, f"expected a string, got {_shown(value)}")
        return value

    def text_or_null(self, value: Any, where: str) -> str | None:
        return None if value is None else self.text(value, where)

    def flag(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            self.fail(where, f"expected true or false, got {_shown(value)}")
        return value

    def integer(self, value: Any, where: str, low: int = 0, high: int = MAX_STEP) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            self.fail(where, f"expected an integer from {low} to {high}, got {_shown(value)}")
        return value

    def fraction(self, value: Any, where: str) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0
        if not ok:  # NaN fails the comparison too
            self.fail(where, f"expected a number from 0 to 1, got {_shown(value)}")
        return float(value)

    def number(self, value: Any, where: str) -> float:
        """Any number; non-finite ones are written as the strings "inf", "-inf" and "nan"."""
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        if value in ("inf", "-inf", "nan"):
            return float(value)
        self.fail(where, f'expected a finite number (or "inf", "-inf", "nan"), got {_shown(value)}')

    def count(self, value: Any, where: str) -> float:
        number = self.number(value, where)
        if not 0.0 <= number <= MAX_STEP:
            self.fail(where, f"expected a finite number from 0 to {MAX_STEP}, got {_shown(value)}")
        return number

    def enum(self, enum: Any, value: Any, where: str) -> Any:
        try:
            return enum(self.text(value, where))
        except ValueError:
            allowed = ", ".join(m.value for m in enum)
            self.fail(where, f"unknown value {_short(value)}; expected one of: {allowed}")

    def kind(self, value: Any, where: str) -> FailureKind:
        """A failure kind's name: a built-in one, a registered plugin's, or one this process does not know (a trace
        written with a plugin that is not installed), reported by its name."""
        name = self.text(value, where)
        try:
            return FailureKind.declare(name)
        except ValueError:
            self.fail(where, f"not a failure kind's name: {_short(value)}; expected lower-case letters, digits and _")

    def index(self, value: Any, where: str, size: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < size:
            self.fail(where, f"expected the index of an event (0 to {size - 1}), got {_shown(value)}")
        return value

    def finite(self, value: Any, where: str) -> None:
        """Values kept as they are (meta fields a later version adds) hold no float too large for JSON."""
        found = _non_finite(value)
        if found is not None:
            self.fail(where + found, "a number too large for a float; a trace holds only finite numbers")

    # --- sections ---------------------------------------------------------------------------------

    def meta(self, raw: Any) -> dict[str, Any]:
        meta = self.obj(raw, "meta")
        for key, low in _META_INTS.items():
            if key in meta:
                self.integer(meta[key], f"meta.{key}", low=low)
        for key in _META_TEXT:
            if key in meta:
                self.text(meta[key], f"meta.{key}")
        if "compiled" in meta:
            self.flag(meta["compiled"], "meta.compiled")
        for key, low in _META_OPTIONAL.items():
            if meta.get(key) is not None:
                self.integer(meta[key], f"meta.{key}", low=low)
        if meta.get("backend") is not None:
            self.text(meta["backend"], "meta.backend")
        self.finite(meta, "meta")
        rank, world = meta.get("rank"), meta.get("world_size")
        if rank is not None and world is not None and rank >= world:
            self.fail("meta.rank", f"rank {rank} is not below meta.world_size {world}")
        return meta

    def config(self, raw: Any) -> dict[str, Any]:
        """The known configuration fields, each checked by DebugConfig; fields a later version added are skipped."""
        config = self.obj(raw, "config")
        known = {name: config[name] for name in DebugConfig().as_dict() if name in config}
        for name, value in known.items():
            try:
                DebugConfig().replace(**{name: value})
            except ConfigError as exc:
                self.fail(f"config.{name}", str(exc).split(": ", 1)[-1])
        return known

    def layers(self, raw: Any) -> list[dict[str, Any]]:
        layers = self.seq(raw, "model.layers")
        for i, item in enumerate(layers):
            where = f"model.layers[{i}]"
            layer = self.obj(item, where)
            self.text(self.field(layer, "name", where), f"{where}.name")
            self.text(self.field(layer, "type", where), f"{where}.type")
            if "role" in layer:
                self.text(layer["role"], f"{where}.role")
            if "params" in layer:
                for j, param in enumerate(self.seq(layer["params"], f"{where}.params")):
                    self.text(param, f"{where}.params[{j}]")
            if "numel" in layer:
                self.integer(layer["numel"], f"{where}.numel")
            self.finite(layer, where)
        return layers

    def event(self, raw: Any, where: str) -> SemanticEvent:
        ev = self.obj(raw, where)
        start = self.integer(self.field(ev, "step_start", where), f"{where}.step_start")
        end = self.integer(self.field(ev, "step_end", where), f"{where}.step_end")
        if end < start:
            self.fail(f"{where}.step_end", f"step_end {end} is before step_start {start}")
        kind_raw = self.field(ev, "kind", where)
        kind = None if kind_raw is None else self.kind(kind_raw, f"{where}.kind")
        counts = _COUNT_METRICS | (registry.room(kind).count_metrics if kind is not None else frozenset())
        metrics: dict[str, float] = {}
        for name, value in self.obj(self.field(ev, "metrics", where), f"{where}.metrics").items():
            check = self.count if name in counts else self.number
            metrics[name] = check(value, f"{where}.metrics{_key(name)}")
        event_type = self.enum(EventType, self.field(ev, "event_type", where), f"{where}.event_type")
        from_state = self.text_or_null(self.field(ev, "from_state", where), f"{where}.from_state")
        to_state = self.text(self.field(ev, "to_state", where), f"{where}.to_state")
        return SemanticEvent(
            event_type=event_type,
            kind=kind,
            layer=self.text(self.field(ev, "layer", where), f"{where}.layer"),
            param=self.text_or_null(self.field(ev, "param", where), f"{where}.param"),
            step_start=start,
            step_end=end,
            from_state=None if from_state is None else _state(event_type, kind, from_state),
            to_state=_state(event_type, kind, to_state),
            metrics=metrics,
            confidence=self.fraction(self.field(ev, "confidence", where), f"{where}.confidence"),
            detail=self.text_or_null(ev.get("detail"), f"{where}.detail") or "",
        )

    def hypothesis(self, raw: Any, where: str, events: int) -> None:
        hyp = self.obj(raw, where)
        self.kind(self.field(hyp, "kind", where), f"{where}.kind")
        self.fraction(self.field(hyp, "confidence", where), f"{where}.confidence")
        self.index(self.field(hyp, "root", where), f"{where}.root", events)
        for j, idx in enumerate(self.seq(self.field(hyp, "chain", where), f"{where}.chain")):
            self.index(idx, f"{where}.chain[{j}]", events)
        for j, link in enumerate(self.seq(self.field(hyp, "couplings", where), f"{where}.couplings")):
            at = f"{where}.couplings[{j}]"
            if not isinstance(link, list) or len(link) != 3:
                self.fail(at, f"expected [cause index, effect index, relation], got {_shown(link)}")
            self.index(link[0], f"{at}[0]", events)
            self.index(link[1], f"{at}[1]", events)
            self.text(link[2], f"{at}[2]")
        self.text(self.field(hyp, "explanation", where), f"{where}.explanation")
        self.text(self.field(hyp, "suggestion", where), f"{where}.suggestion")

    def history(self, raw: Any) -> dict[str, dict[str, list[list[float]]]]:
        history: dict[str, dict[str, list[list[float]]]] = {}
        for metric, per_layer in self.obj(raw, "history").items():
            at_metric = f"history{_key(metric)}"
            for layer, points in self.obj(per_layer, at_metric).items():
                where = f"{at_metric}{_key(layer)}"
                series = history.setdefault(metric, {})[layer] = []
                for i, point in enumerate(self.seq(points, where)):
                    if type(point) is list and len(point) == 2:  # the common case, checked without a call
                        step, value = point
                        if type(step) is int and 0 <= step <= MAX_STEP and type(value) is float and _finite(value):
                            series.append(point)
                            continue
                    if not isinstance(point, list) or len(point) != 2:
                        self.fail(f"{where}[{i}]", f"expected a [step, value] pair, got {_shown(point)}")
                    series.append(
                        [self.integer(point[0], f"{where}[{i}][0]"), self.number(point[1], f"{where}[{i}][1]")]
                    )
        return history


class UnsafeJson(ValueError):
    """JSON text that :func:`guarded_loads` refuses; the message says why, without the file's name."""


def guarded_loads(
    text: str,
    what: str = "trace",
    *,
    max_depth: int = MAX_DEPTH,
    max_digits: int = MAX_DIGITS,
    finite: bool = False,
) -> Any:
    """``json.loads`` for text from anywhere: refused before parsing when empty, nested deeper than ``max_depth`` or
    holding a number of more than ``max_digits`` digits; a bare ``NaN`` or ``Infinity`` is refused, and with
    ``finite`` a number too large for a float (``1e400``) too. Raises :class:`UnsafeJson` saying what was found and
    what a NeuralDBG ``what`` (``trace``, ``baseline``) holds."""
    if not text.strip():
        raise UnsafeJson(f"the file is empty; expected a NeuralDBG JSON {what}")
    structure = outside_strings(text)
    depth = nesting_depth(structure)
    if depth > max_depth:
        raise UnsafeJson(f"JSON nested {depth} levels deep; a NeuralDBG {what} nests at most {max_depth}")
    if longest_digit_run_exceeds(structure, max_digits):  # Python parses long integers in quadratic time,
        raise UnsafeJson(  # and refuses those past 4300 digits
            f"a number with more than {max_digits} digits in a row; no field of a {what} holds one"
        )
    try:
        doc = json.loads(text, parse_constant=_parse_constant)
    except json.JSONDecodeError as exc:
        hint = " (the file looks truncated)" if exc.pos >= len(text.rstrip()) - 1 else ""
        raise UnsafeJson(f"not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}{hint}") from None
    except _BadNumber as exc:
        raise UnsafeJson(str(exc)) from None
    where = _non_finite(doc) if finite else None
    if where is not None:
        raise UnsafeJson(f"{where.lstrip('.') or 'top level'}: a number too large for a float; a {what} holds none")
    return doc


def parse(text: str, source: str) -> dict[str, Any]:
    """Parse and check trace JSON; returns the parts a Trace reads, events decoded into SemanticEvent objects.

    Raises TraceError (one line: the file, the JSON path, what was expected) for anything malformed.
    """
    reader = _Reader(source)
    try:
        doc = guarded_loads(text, "trace")
    except UnsafeJson as exc:
        raise TraceError(f"{reader.source}: {exc}") from None
    doc = reader.obj(doc, "")
    if doc.get("format") != FORMAT:
        reader.fail("format", f"expected {FORMAT!r}, got {_short(doc.get('format'))}: not a NeuralDBG trace")
    version = reader.integer(reader.field(doc, "version", ""), "version", low=1, high=2**31)
    if version > VERSION:
        reader.fail(
            "version", f"trace version {version} was written by a newer NeuralDBG; this one reads up to {VERSION}"
        )
    raw_events = reader.seq(reader.field(doc, "events", ""), "events")
    events = [reader.event(raw, f"events[{i}]") for i, raw in enumerate(raw_events)]
    model = reader.obj(reader.field(doc, "model", ""), "model")
    order = [
        reader.text(x, f"model.order[{i}]")
        for i, x in enumerate(reader.seq(reader.field(model, "order", "model"), "model.order"))
    ]
    calls: dict[tuple[str, int], float] = {}
    raw_calls = model.get("calls")  # absent from traces of earlier versions: later calls then follow the first
    for i, item in enumerate(reader.seq(raw_calls, "model.calls") if raw_calls is not None else []):
        entry = reader.seq(item, f"model.calls[{i}]")
        if len(entry) != 3:
            reader.fail(f"model.calls[{i}]", f"expected [layer, call, position], got {_shown(item)}")
        layer = reader.text(entry[0], f"model.calls[{i}][0]")
        call = reader.integer(entry[1], f"model.calls[{i}][1]")
        position = reader.number(entry[2], f"model.calls[{i}][2]")
        if not math.isfinite(position):
            reader.fail(f"model.calls[{i}][2]", f"expected a finite position, got {_shown(entry[2])}")
        calls[(layer, call)] = position
    layers = reader.layers(reader.field(model, "layers", "model"))
    for i, hyp in enumerate(reader.seq(reader.field(doc, "hypotheses", ""), "hypotheses")):
        reader.hypothesis(hyp, f"hypotheses[{i}]", len(events))
    return {
        "meta": reader.meta(doc.get("meta") if doc.get("meta") is not None else {}),
        "config": reader.config(doc.get("config") if doc.get("config") is not None else {}),
        "order": order,
        "calls": calls,
        "layers": layers,
        "events": events,
        "history": reader.history(doc.get("history") if doc.get("history") is not None else {}),
    }


def _state(event_type: EventType, kind: FailureKind | None, name: str) -> HealthState | FailureKind | str:
    """An event's state read back as the live run held it: the built-in health state of that name for its signal
    (``non_finite`` on an activation is ``ActivationHealth.NON_FINITE``, though a kind has the same name), else a
    state of its kind's room (a plugin's, when installed), else its kind itself (a run-level finding's state is its
    kind), else the name."""
    found = state_of(event_type, name)
    if isinstance(found, HealthState):
        return found
    if kind is not None:
        for state in registry.room(kind).states:
            if state.value == name:
                return state
        if name == kind.value:
            return kind
    return found
