"""What the reasoning knows about the model: forward order and what each layer is."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..events import SemanticEvent


@dataclass(frozen=True)
class Topology:
    order: list[str]  # layer names in forward execution order
    types: dict[str, str]  # layer -> module class name
    roles: dict[str, str]  # layer -> role ("gated", "bounded", "parametric", "other")
    first_step: int = 0  # first observed step
    last_step: int = -1  # last observed step of the run (-1: unknown)
    #: (layer, call) -> forward position of a later call of a layer called several times in a forward pass (a shared
    #: activation module): just after the output that precedes it, where it runs (unknown calls: after the first)
    calls: dict[tuple[str, int], float] = field(default_factory=dict)
    _index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    _pinned: dict[int, float] = field(default_factory=dict, repr=False, compare=False)
    _fed_by: list[int] = field(default_factory=list, repr=False, compare=False)  # position -> feeding position

    def __post_init__(self) -> None:
        self._index.update({name: i for i, name in enumerate(self.order)})

    def pinned(self, events: Sequence[SemanticEvent]) -> Topology:
        """A copy that knows the position of each of ``events`` by heart (the engine asks for them many times).
        Valid while those events live: positions are remembered by object identity."""
        positions = {id(e): self.event_position(e) for e in events}
        return dataclasses.replace(self, _index={}, _pinned=positions, _fed_by=[])

    def position(self, layer: str) -> int:
        """Forward position; the model's input/loss ("") comes first, unknown layers last."""
        if layer == "":
            return -1
        return self._index.get(layer, len(self.order))

    def event_position(self, event: SemanticEvent) -> float:
        """Forward position of an event; within a layer, a later call comes later."""
        known = self._pinned.get(id(event))
        if known is not None:
            return known
        call = event.metrics.get("call", 0.0)
        placed = self.calls.get((event.layer, int(call))) if call else None
        return placed if placed is not None else self.position(event.layer) + call * 1e-3

    def describe(self, layer: str) -> str:
        if layer == "":
            return "the model"
        kind = self.types.get(layer)
        return f"'{layer}' ({kind})" if kind else f"'{layer}'"

    def feeding(self, layer: str) -> str | None:
        """The nearest parametric layer before ``layer`` in forward order (what feeds an activation)."""
        pos = self.position(layer)
        return None if pos < 0 else self._parametric_before(min(pos, len(self.order)))

    def last_parametric(self) -> str | None:
        """The last layer with parameters in forward order."""
        return self._parametric_before(len(self.order))

    def _parametric_before(self, pos: int) -> str | None:
        if not self._fed_by:  # the nearest parametric position before each position, computed once
            last = -1
            for i, name in enumerate(self.order):
                self._fed_by.append(last)
                if self.roles.get(name) == "parametric":
                    last = i
            self._fed_by.append(last)
        fed = self._fed_by[pos]
        return self.order[fed] if fed >= 0 else None


def call_positions(keys: Sequence[tuple[str, int]], order: Sequence[str]) -> dict[tuple[str, int], float]:
    """Where each later call of a layer runs, for :attr:`Topology.calls`: ``keys`` are the layer outputs of a
    forward pass in the order they were produced, ``(layer, call)``; ``order`` the layers' first calls in that
    order. A later call sits just after the output before it (a shared ReLU's second call right after the layer
    it activates), so first calls keep their positions in ``order``."""
    index = {name: i for i, name in enumerate(order)}
    placed: dict[tuple[str, int], float] = {}
    last = -1.0
    for name, call in keys:
        if call == 0:
            last = float(index.get(name, last))
        else:
            last += 1e-2
            placed[(name, call)] = last
    return placed
