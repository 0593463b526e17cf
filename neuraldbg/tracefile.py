"""Reading a saved trace back: ``neuraldbg.load(path)`` returns a :class:`Trace` with the debugger's query
methods (``explain_failure()``, ``hypotheses()``, ``export_mermaid_causal_graph()``, ...)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from typing import Any

from . import plugins
from .config import DebugConfig
from .diagnosis import Diagnosis
from .errors import ConfigError, TraceError
from .events import SemanticEvent
from .export import trace as trace_format
from .history import History
from .reasoning import CausalRule, Topology


class Trace(Diagnosis):
    """A finished run read from a JSON trace file."""

    def __init__(self, doc: dict[str, Any], source: str, plugins_: Iterable[Any] = ()) -> None:
        self.source = source
        self.config = _config(doc["config"])
        self._doc_meta: dict[str, Any] = doc["meta"]
        self._events: list[SemanticEvent] = doc["events"]
        layers = doc["layers"]
        self._layers_meta = layers
        self._topo = Topology(
            order=doc["order"],
            types={str(x["name"]): str(x["type"]) for x in layers},
            roles={str(x["name"]): str(x.get("role", "other")) for x in layers},
            first_step=0,
            last_step=int(doc["meta"].get("last_step", -1)),
        )
        self.history = History.from_json(doc["history"], self.config.history_points)
        self._rules: list[CausalRule] = plugins.rules(plugins.manager(plugins_))

    def _current(self) -> tuple[list[SemanticEvent], Topology, Sequence[CausalRule]]:
        return self._events, self._topo, self._rules

    def _meta(self) -> dict[str, Any]:
        return {**self._doc_meta, "config": self.config.as_dict(), "layers": self._layers_meta}

    @property
    def steps(self) -> int:
        return int(self._doc_meta.get("steps_observed", 0))

    def __repr__(self) -> str:
        return f"<neuraldbg.Trace {self.source!r}: {len(self._events)} events>"


def _config(raw: dict[str, Any]) -> DebugConfig:
    """The run's configuration; fields this version does not know, or cannot accept, keep their defaults."""
    known = {f.name for f in dataclasses.fields(DebugConfig)}
    config = DebugConfig()
    for key, value in raw.items():
        if key in known:
            try:
                config = config.replace(**{key: value})
            except ConfigError:
                continue
    return config


def load(path: str | os.PathLike[str], plugins: Iterable[Any] = ()) -> Trace:
    """Read a trace written by ``dbg.save(path)``. Raises TraceError naming the file and the problem."""
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise TraceError(f"{source}: no such trace file") from None
    except IsADirectoryError:
        raise TraceError(f"{source}: is a directory, expected a JSON trace file") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{source}: not a text file ({exc.reason} at byte {exc.start}); expected JSON") from None
    except OSError as exc:
        raise TraceError(f"{source}: cannot read the trace file: {exc.strerror or exc}") from None
    return Trace(trace_format.parse(text, source), source, plugins)
