"""The plugin manager: built-in detectors and rules, entry-point plugins, and plugins registered by users."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import pluggy

from ..config import DebugConfig
from ..detectors import builtin_detectors
from ..detectors.base import Detector
from ..reasoning.rules import CausalRule, builtin_rules
from . import hookspecs
from .hookspecs import hookimpl

_registered: list[Any] = []


class _Builtin:
    @hookimpl
    def neuraldbg_detectors(self, config: DebugConfig) -> list[Detector]:
        return builtin_detectors()

    @hookimpl
    def neuraldbg_causal_rules(self) -> list[CausalRule]:
        return builtin_rules()


def register_plugin(plugin: Any) -> None:
    """Register a plugin (module or object with hook implementations) for every debugger created afterwards."""
    if plugin not in _registered:
        _registered.append(plugin)


def unregister_plugin(plugin: Any) -> None:
    if plugin in _registered:
        _registered.remove(plugin)


@functools.lru_cache(maxsize=1)
def _entry_point_plugins() -> tuple[Any, ...]:
    pm = pluggy.PluginManager("neuraldbg")
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints("neuraldbg")
    return tuple(pm.get_plugins())


def manager(extra: Iterable[Any] = ()) -> pluggy.PluginManager:
    pm = pluggy.PluginManager("neuraldbg")
    pm.add_hookspecs(hookspecs)
    pm.register(_Builtin(), name="neuraldbg.builtin")
    for plugin in (*_entry_point_plugins(), *_registered, *extra):
        if not pm.is_registered(plugin):
            pm.register(plugin)
    return pm


def detectors(pm: pluggy.PluginManager, config: DebugConfig) -> list[Detector]:
    return [d for group in pm.hook.neuraldbg_detectors(config=config) for d in group]


def rules(pm: pluggy.PluginManager) -> list[CausalRule]:
    return [r for group in pm.hook.neuraldbg_causal_rules() for r in group]


__all__ = ["detectors", "manager", "register_plugin", "rules", "unregister_plugin"]
