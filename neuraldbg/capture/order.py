"""Forward execution order of layer outputs, as the hooks see it."""

from __future__ import annotations

from ..model.info import LayerInfo, Role
from ..stats.step import SlotKey


class LayerOrder:
    """Layer outputs in the order the forward pass produces them, keyed ``(name, call)``.

    ``keys`` is shared with the analysis (detectors and reasoning read it); a key is appended the first time it is
    seen. A module called several times in one forward pass gets one key per call.
    """

    def __init__(self, infos: dict[str, LayerInfo], keys: list[SlotKey]) -> None:
        self._infos = infos
        self.keys = keys
        self._known: set[SlotKey] = set(keys)
        self._calls: dict[str, int] = {}
        self._seen = 0
        self.complete = False  # the last forward pass added no key: what comes after a layer is known
        self._next_role: dict[SlotKey, Role] = {}

    def forward_begins(self) -> None:
        self._calls.clear()
        self.complete = self._seen == len(self.keys) > 0
        self._seen = len(self.keys)

    def key(self, name: str) -> SlotKey:
        """(name, call index in this forward pass), recorded in forward order the first time it is seen."""
        call = self._calls.get(name, 0)
        self._calls[name] = call + 1
        return self.first(name, call)

    def first(self, name: str, call: int = 0) -> SlotKey:
        key = (name, call)
        if key not in self._known:
            self._known.add(key)
            self.keys.append(key)
        return key

    def activated_by_module(self, key: SlotKey) -> bool:
        """Whether the layer's per-unit statistics are covered elsewhere: the next layer output in forward order
        is a ReLU-family or bounded activation module, or no parametric layer follows (the model's output layer:
        its units feed the loss, not a ReLU)."""
        if len(self._next_role) != len(self.keys):
            roles = [self._infos[name].role for name, _ in self.keys]
            last = max((i for i, r in enumerate(roles) if r is Role.PARAMETRIC), default=-1)
            self._next_role = {
                key: (roles[i + 1] if i + 1 < len(roles) and i < last else Role.GATED)
                for i, key in enumerate(self.keys)
            }
        return self._next_role.get(key) in (Role.GATED, Role.BOUNDED)
