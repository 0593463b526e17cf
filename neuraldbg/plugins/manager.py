"""The plugin manager: the built-in kinds, entry-point plugins, and plugins registered by users.

A debugger (and a trace read back) asks its manager for its kinds, detectors and causal rules: the built-in kinds
(:mod:`neuraldbg.kinds`), the kinds plugins declare (each registered by name, process-wide, so a trace or a report
names it), and the extra detectors and rules plugins give. A plugin reaches a debugger three ways: an entry point
in the ``neuraldbg`` group (every debugger of every process), :func:`register_plugin` (every debugger created
afterwards in this process) or ``NeuralDbg(model, plugins=[...])`` (that debugger only).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import pluggy

from ..config import DebugConfig
from ..detectors.base import Detector
from ..errors import ConfigError
from ..kinds import BUILTIN, registry
from ..kinds import detectors as kind_detectors
from ..kinds import rules as kind_rules
from ..kinds.base import Kind
from ..reasoning.rules import CausalRule
from . import hookspecs
from .hookspecs import hookimpl

_registered: list[Any] = []
#: The manager of the last debugger made without plugins of its own, with the plugins it was made of: the next
#: such debugger shares it while the entry points and the registered plugins are the same objects (registering a
#: plugin's hook implementations costs more than a quarter of a millisecond, a smoke test's whole attach).
_shared: tuple[tuple[Any, ...], pluggy.PluginManager] | None = None


class _Builtin:
    @hookimpl
    def neuraldbg_kinds(self) -> list[Kind]:
        return list(BUILTIN)


def register_plugin(plugin: Any) -> None:
    """Register a plugin (module or object with hook implementations) for every debugger created afterwards."""
    if plugin not in _registered:
        _registered.append(plugin)


def unregister_plugin(plugin: Any) -> None:
    """Stop giving ``plugin`` to the debuggers created from now on."""
    if plugin in _registered:
        _registered.remove(plugin)


@functools.lru_cache(maxsize=1)
def _entry_point_plugins() -> tuple[Any, ...]:
    pm = pluggy.PluginManager("neuraldbg")
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints("neuraldbg")
    return tuple(pm.get_plugins())


def manager(extra: Iterable[Any] = ()) -> pluggy.PluginManager:
    """A plugin manager holding the built-in kinds, the entry points, the registered plugins and ``extra``. Without
    ``extra``, the same manager as the last call's while its plugins are the same objects (the hooks are still
    called for each debugger: its detectors are its own)."""
    global _shared
    extra = tuple(extra)
    plugins = (*_entry_point_plugins(), *_registered)
    shared = _shared
    if not extra and shared is not None and registry.same_objects(shared[0], plugins):
        return shared[1]
    pm = pluggy.PluginManager("neuraldbg")
    pm.add_hookspecs(hookspecs)
    pm.register(_Builtin(), name="neuraldbg.builtin")
    for plugin in (*plugins, *extra):
        if not pm.is_registered(plugin):
            pm.register(plugin)
    if not extra:
        _shared = (plugins, pm)
    return pm


def kinds_of(pm: pluggy.PluginManager) -> list[Kind]:
    """The kinds of ``pm``'s plugins, built-in ones first, each registered (process-wide, by name)."""
    found: list[Kind] = []
    for group in reversed(pm.hook.neuraldbg_kinds()):  # pluggy calls the latest registered first
        for room in group:
            if not isinstance(room, Kind):
                raise ConfigError(
                    f"neuraldbg_kinds(): expected neuraldbg.kinds.Kind instances, got {type(room).__name__}"
                )
            registered = registry.register(room)
            if registered not in found:
                found.append(registered)
    return found


def detectors(pm: pluggy.PluginManager, config: DebugConfig) -> list[Detector]:
    """Fresh detectors for a new debugger: the plugins' own, then those of every kind of ``pm``."""
    extra = [d for group in pm.hook.neuraldbg_detectors(config=config) for d in group]
    return [*extra, *kind_detectors(config, kinds_of(pm))]


def rules(pm: pluggy.PluginManager, also: Iterable[Kind] = ()) -> list[CausalRule]:
    """The plugins' own causal rules, then those of every kind of ``pm`` and of ``also`` (a saved run's kinds that
    a plugin of this process registered), effects named by state resolved."""
    chosen = kinds_of(pm)
    chosen += [k for k in also if k not in chosen]
    extra = [registry.resolve(r) for group in pm.hook.neuraldbg_causal_rules() for r in group]
    return [*extra, *kind_rules(chosen)]


__all__ = ["detectors", "kinds_of", "manager", "register_plugin", "rules", "unregister_plugin"]
