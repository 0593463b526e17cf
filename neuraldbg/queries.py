"""The query API shared by a live debugger, a trace loaded from disk and a distributed job.

Each holds semantic events and what the reasoning needs about the model (forward order, layer types); this class
answers every question from those: hypotheses, explanations, root causes, couplings, chains, graphs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .config import DebugConfig
from .errors import ConfigError, did_you_mean
from .events import EventType, FailureKind, SemanticEvent
from .export.inert import inert
from .health import ActivationHealth, GradientHealth, HealthState, UpdateHealth
from .reasoning import CausalHypothesis, CausalRule, Coupling, Topology, diagnose
from .stats.history import History


@dataclass(frozen=True)
class HeldAbove:
    """A stretch of recorded steps over which a layer's series stayed above a limit, and its peak."""

    layer: str
    start: int
    end: int
    points: int
    peak: float


class Queries:
    """Queries over a run's events. Subclasses provide ``_current()``; everything else is shared."""

    history: History

    def _current(self) -> tuple[list[SemanticEvent], Topology, Sequence[CausalRule]]:
        raise NotImplementedError

    def _meta(self) -> dict[str, Any]:
        raise NotImplementedError

    def _series(self, metric: str, layer: str) -> list[tuple[int, float]]:
        series = self.history.get(metric, layer)
        return series.points() if series is not None else []

    # --- the questions users ask ------------------------------------------------------------------

    @property
    def events(self) -> list[SemanticEvent]:
        """Every semantic event, failures and evidence, ordered by onset."""
        return self._current()[0]

    @property
    def model_name(self) -> str:
        """The class name of the model that was watched."""
        return str(self._meta().get("model", ""))

    @property
    def meta(self) -> dict[str, Any]:
        """About the run: model class, steps observed, last step, step mode, torch / Python / NeuralDBG versions."""
        return {k: v for k, v in self._meta().items() if k not in ("config", "layers")}

    def checked_kinds(self) -> list[str]:
        """The names of the failure kinds this run was checked for: the built-in ones and the plugins' (for a saved
        run, also any other kind it reported)."""
        from .kinds import BUILTIN

        names = [room.name for room in BUILTIN]
        return [*names, *dict.fromkeys(e.kind.value for e in self.events if e.kind is not None and e.kind not in names)]

    @property
    def layers(self) -> list[str]:
        """Watched layers in forward execution order."""
        return list(self._current()[1].order)

    def hypotheses(self) -> list[CausalHypothesis]:
        """Ranked causal hypotheses, most likely first; ``[]`` when training looks healthy."""
        events, topo, rules = self._current()
        cached = getattr(self, "_hyp_cache", None)
        if cached is not None and cached[0] is events:  # events lists are reused until something changes
            return list(cached[1])
        result = diagnose(events, topo, rules, self._series)
        self._hyp_cache = (events, result)
        return list(result)

    @property
    def healthy(self) -> bool:
        """No hypothesis at all: a run that was not (fully) observed has one, so it is never healthy."""
        return not self.hypotheses()

    def explain_failure(self) -> list[str]:
        """One explanation per hypothesis, in the same order; ``[]`` when training looks healthy. Text meant to be
        printed: a layer name's control, bidirectional and lone surrogate characters are visible escapes (see
        :mod:`neuraldbg.export.inert`), so ``print(text)`` never sends a name's escape sequence to the terminal
        (``hypotheses()`` keeps each explanation as written)."""
        return [inert(h.explanation, lines=True) for h in self.hypotheses()]

    def get_root_causes(self) -> list[SemanticEvent]:
        """The root event of each hypothesis, ranked."""
        return [h.root for h in self.hypotheses()]

    def detect_coupled_failures(self) -> list[Coupling]:
        """Directed causal links between events (cause explains effect), deduplicated; one per explained event.

        Events that are part of a fault rather than its consequence have none: parameters frozen for the same
        reason, a layer's later state in the same layer, updates as large as the weights at the same learning
        rate (they are in the hypothesis' ``chain``). No link joins an event to another in the same place.
        """
        seen: set[tuple[int, int]] = set()
        out: list[Coupling] = []
        for h in self.hypotheses():
            for c in h.couplings:
                key = (id(c.cause), id(c.effect))
                if key not in seen:
                    seen.add(key)
                    out.append(c)
        return out

    def trace_causal_chain(self, selector: FailureKind | EventType | HealthState | str) -> list[SemanticEvent]:
        """The chain of events leading to a failure, root first.

        ``selector`` is a :class:`FailureKind`, an :class:`EventType`, a health state, or the name or value
        of any of them as a string (``"vanishing_gradients"``, ``"VANISHING_GRADIENTS"``, ``"dead"``). The
        chain is taken from the most likely hypothesis that involves a matching event: from its root down to
        the matching events. ``[]`` when nothing matches.
        """
        match = _selector(selector)
        for h in self.hypotheses():
            hits = [e for e in h.chain if match(e)]
            if not hits:
                continue
            if match(h.root):
                return list(h.chain)
            parents = {id(c.effect): c.cause for c in h.couplings}
            keep = {id(h.root)}
            for e in hits:
                node: SemanticEvent | None = e
                while node is not None and id(node) not in keep:
                    keep.add(id(node))
                    node = parents.get(id(node))
            return [e for e in h.chain if id(e) in keep]
        return []

    def held_above(self, metric: str, limit: float) -> list[HeldAbove]:
        """Layers whose recorded ``metric`` (``"dead_fraction"``) stayed above ``limit`` for at least ``persistence``
        consecutive recorded points (the rule that makes a state an event), each at its longest such stretch. An
        assertion helper's own limit (``max_fraction``) is judged with the engine's persistence this way."""
        config = self._meta().get("config") or {}
        persistence = int(config.get("persistence", DebugConfig().persistence))
        found = []
        for layer in self.history.layers(metric):
            series = self.history.get(metric, layer)
            best = _longest_above(series.points() if series is not None else [], limit)
            if best is not None and best.points >= persistence:
                found.append(HeldAbove(layer, best.start, best.end, best.points, best.peak))
        return found

    def export_mermaid_causal_graph(self) -> str:
        """A Mermaid flowchart of the causal chains (renders on GitHub and in mermaid.live)."""
        from .export.mermaid import causal_graph

        return causal_graph(self.hypotheses(), self._current()[1])

    def report(self) -> str:
        """A terminal-friendly report: verdict, then each hypothesis' explanation."""
        from .export.report import report

        return report(self.hypotheses(), self._meta())

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON trace as a dictionary (see :func:`neuraldbg.load`)."""
        from .export.trace_format import to_dict

        events, topo, _ = self._current()
        return to_dict(events, self.hypotheses(), topo, self._meta(), self.history)

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the versioned JSON trace to ``path``; returns the path written."""
        from .export.trace_format import write

        return write(path, self.to_dict())


def _longest_above(points: list[tuple[int, float]], limit: float) -> HeldAbove | None:
    best: HeldAbove | None = None
    run: list[tuple[int, float]] = []
    for step, value in [*points, (0, -1.0)]:  # a sentinel closes the last run
        if value > limit:
            run.append((step, value))
            continue
        if run and (best is None or len(run) > best.points):
            best = HeldAbove("", run[0][0], run[-1][0], len(run), max(v for _, v in run))
        run = []
    return best


def _selector(selector: FailureKind | EventType | HealthState | str) -> Any:
    if isinstance(selector, FailureKind):
        return lambda e: e.kind is selector
    if isinstance(selector, EventType):
        return lambda e: e.event_type is selector
    if isinstance(selector, HealthState):
        return lambda e: e.to_state == selector.value
    if not isinstance(selector, str):
        raise ConfigError(
            "trace_causal_chain(): expected a FailureKind, an EventType, a health state (a HealthState member) or "
            f"the name of one of them as a string, got {type(selector).__name__}"
        )
    from .kinds import registry

    text = selector.strip().lower()
    for kind in FailureKind:
        if text in (kind.value, kind.name.lower()):
            return lambda e, k=kind: e.kind is k
    for etype in EventType:
        if text in (etype.value, etype.name.lower()):
            return lambda e, t=etype: e.event_type is t
    # the built-in signals' states (normal ones included) and every registered kind's, a plugin's too
    known = [s for enum in (GradientHealth, ActivationHealth, UpdateHealth) for s in enum] + registry.states()
    for state in known:
        if text in (str(state.value).lower(), state.name.lower()):
            return lambda e, v=state.value: e.to_state == v
    states = {str(s.value) for s in known}
    names = sorted({k.value for k in FailureKind} | {t.value for t in EventType} | states)
    raise ConfigError(
        f"trace_causal_chain(): unknown selector {selector!r}{did_you_mean(text, names)}; "
        f"expected one of: {', '.join(names)}"
    )
