"""The plugin manager: the built-in kinds, entry-point plugins, and plugins registered by users.

A debugger (and a trace read back) asks its manager for its kinds, detectors and causal rules: the built-in kinds
(:mod:`neuraldbg.kinds`), the kinds plugins declare (each registered by name, process-wide, so a trace or a report
names it), and the extra detectors and rules plugins give. A plugin reaches a debugger three ways: an entry point
in the ``neuraldbg`` group (every debugger of every process), :func:`register_plugin` (every debugger created
afterwards in this process) or ``NeuralDbg(model, plugins=[...])`` (that debugger only).

A plugin that fails is named with where it came from. An installed one (an entry point) that cannot be imported or
registered, or whose hook raises or returns something malformed, is skipped with a :class:`NeuralDbgWarning`: it
is in every process of the installation, and the built-in diagnosis goes on without it. A plugin given in code
(``plugins=[...]``, :func:`register_plugin`) that fails so is a :class:`ConfigError` when the debugger is made.
"""

from __future__ import annotations

import functools
import importlib.metadata
import types
import warnings
from collections.abc import Iterable
from typing import Any

import pluggy

from ..config import DebugConfig
from ..detectors.base import Detector
from ..errors import ConfigError, NeuralDbgWarning
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
#: id() of each plugin loaded from an entry point -> the plugin (held: its id stays its own) and how a message names
#: it (the entry point and its distribution).
_entry_points: dict[int, tuple[Any, str]] = {}


class _Builtin:
    @hookimpl
    def neuraldbg_kinds(self) -> list[Kind]:
        return list(BUILTIN)


def register_plugin(plugin: Any) -> None:
    """Register a plugin (module or object with hook implementations) for every debugger created afterwards."""
    _check_plugin(plugin, "register_plugin()", "neuraldbg.register_plugin({})")
    if plugin not in _registered:
        _registered.append(plugin)


def unregister_plugin(plugin: Any) -> None:
    """Stop giving ``plugin`` to the debuggers created from now on."""
    if plugin in _registered:
        _registered.remove(plugin)


@functools.lru_cache(maxsize=1)
def _entry_point_plugins() -> tuple[Any, ...]:
    """The plugins of the ``neuraldbg`` entry points of the installed distributions, loaded once per process. One
    that cannot be imported or registered is skipped with a :class:`NeuralDbgWarning` naming it."""
    pm = pluggy.PluginManager("neuraldbg")
    pm.add_hookspecs(hookspecs)
    _entry_points.clear()
    while True:
        try:
            pm.load_setuptools_entrypoints("neuraldbg")
            break
        except Exception as exc:  # pluggy stops at the first broken entry point: name it, block it, load the rest
            failed = _next_entry_point(pm)
            if failed is None:  # not an entry point's doing
                raise
            point, dist = failed
            pm.set_blocked(point.name)
            name = str(dist.metadata["Name"] or "?")
            warnings.warn(
                f"NeuralDBG skipped the plugin {_entry_point_words(point, name, dist.version)}: loading it failed "
                f"with {exc!r}; NeuralDBG runs without it. Fix that plugin or uninstall it (pip uninstall {name}).",
                NeuralDbgWarning,
                stacklevel=2,
            )
    for plugin, facade in pm.list_plugin_distinfo():
        found = next((p for p in facade.entry_points if p.group == "neuraldbg" and p.name == pm.get_name(plugin)), None)
        if found is not None:
            _entry_points[id(plugin)] = (plugin, _entry_point_words(found, facade.project_name, facade.version))
    return tuple(pm.get_plugins())


def _next_entry_point(
    pm: pluggy.PluginManager,
) -> tuple[importlib.metadata.EntryPoint, importlib.metadata.Distribution] | None:
    """The entry point pluggy's loader tries next (the one that just failed): the first of the group, in its order,
    neither registered nor blocked."""
    for dist in list(importlib.metadata.distributions()):
        for point in dist.entry_points:
            if point.group == "neuraldbg" and not pm.has_plugin(point.name) and not pm.is_blocked(point.name):
                return point, dist
    return None


def _entry_point_words(point: importlib.metadata.EntryPoint, dist_name: str, version: str) -> str:
    return f"entry point '{point.name} = {point.value}' of the distribution {dist_name} {version}"


def _plugin_words(plugin: Any) -> str:
    """How a message names a plugin: its entry point and distribution, its module, or its class."""
    installed = _entry_points.get(id(plugin))
    if installed is not None:
        return installed[1]
    if isinstance(plugin, types.ModuleType):
        return f"plugin module {plugin.__name__!r}"
    return f"plugin {type(plugin).__module__}.{type(plugin).__qualname__} object"


def _check_plugin(plugin: Any, where: str, use: str = "plugins=[{}]") -> None:
    """A string where a plugin belongs (its module's name) is a :class:`ConfigError` saying to pass the module."""
    if isinstance(plugin, (str, bytes)):
        name = plugin.decode(errors="replace") if isinstance(plugin, bytes) else plugin
        module = name if name and all(part.isidentifier() for part in name.split(".")) else "my_plugin"
        raise ConfigError(
            f"{where}: expected a plugin (a module or an object with @hookimpl functions), got the string "
            f"{plugin!r}; import the module and pass it: import {module}, then {use.format(module)}"
        )


def _extra(extra: Iterable[Any]) -> tuple[Any, ...]:
    """``plugins=`` as a tuple of plugins: a string, or one plugin not in a list, is a :class:`ConfigError`."""
    if isinstance(extra, (str, bytes)):
        _check_plugin(extra, f"plugins={extra!r}")
    if isinstance(extra, types.ModuleType) or not isinstance(extra, Iterable):
        raise ConfigError(
            f"plugins=: expected a list of plugins, got {_plugin_words(extra)}; pass plugins=[...] with it inside"
        )
    plugins = tuple(extra)
    for plugin in plugins:
        _check_plugin(plugin, "plugins=[...]")
    return plugins


def manager(extra: Iterable[Any] = ()) -> pluggy.PluginManager:
    """A plugin manager holding the built-in kinds, the entry points, the registered plugins and ``extra``. Without
    ``extra``, the same manager as the last call's while its plugins are the same objects (the hooks are still
    called for each debugger: its detectors are its own)."""
    global _shared
    extra = _extra(extra)
    plugins = (*_entry_point_plugins(), *_registered)
    shared = _shared
    if not extra and shared is not None and registry.same_objects(shared[0], plugins):
        return shared[1]
    pm = pluggy.PluginManager("neuraldbg")
    pm.add_hookspecs(hookspecs)
    pm.register(_Builtin(), name="neuraldbg.builtin")
    for plugin in (*plugins, *extra):
        if not pm.is_registered(plugin):
            try:
                pm.register(plugin)
            except pluggy.PluginValidationError as exc:
                raise ConfigError(f"{_plugin_words(plugin)}: {exc}") from exc
    if not extra:
        _shared = (plugins, pm)
    return pm


def _results(pm: pluggy.PluginManager, hook: str, expected: type, **kwargs: Any) -> list[list[Any]]:
    """What each plugin's ``hook`` returned, in pluggy's order (the latest registered first), each checked to be a
    list of ``expected``. A plugin whose hook raises or returns something else: a :class:`ConfigError` naming it,
    the hook and what was expected, or, for an installed plugin, a :class:`NeuralDbgWarning` and its result
    skipped. A hook returning None gives nothing (pluggy's convention)."""
    impls = getattr(pm.hook, hook).get_hookimpls()
    if any(impl.hookwrapper or impl.wrapper for impl in impls):  # a wrapper: leave the call to pluggy
        return [list(group) for group in getattr(pm.hook, hook)(**kwargs)]
    what = f"a list of {_PUBLIC[expected]} instances"
    found: list[list[Any]] = []
    for impl in reversed(impls):
        try:
            result = impl.function(*[kwargs[name] for name in impl.argnames])
        except Exception as exc:
            _failed(impl.plugin, f"{hook}() raised {exc!r}; expected it to return {what}", exc)
            continue
        if result is None:
            continue
        if not isinstance(result, (list, tuple)):
            _failed(impl.plugin, f"{hook}() returned {_short(repr(result))}; expected {what}", None)
            continue
        wrong = [x for x in result if not isinstance(x, expected)]
        if wrong:
            got = f"{_short(repr(result))}, holding {type(wrong[0]).__name__} {_short(repr(wrong[0]))}"
            _failed(impl.plugin, f"{hook}() returned {got}; expected {what}", None)
            continue
        found.append(list(result))
    return found


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _failed(plugin: Any, problem: str, cause: Exception | None) -> None:
    """Report a plugin's hook that failed: an installed plugin is skipped with a warning, another is an error."""
    if id(plugin) in _entry_points:
        warnings.warn(
            f"NeuralDBG skipped what the plugin {_plugin_words(plugin)} gives: its {problem}. "
            "Fix that plugin or uninstall it.",
            NeuralDbgWarning,
            stacklevel=4,
        )
        return
    raise ConfigError(f"{_plugin_words(plugin)}: its {problem}") from cause


#: How messages name what each hook returns (where users import it from).
_PUBLIC: dict[type, str] = {
    Kind: "neuraldbg.kinds.Kind",
    Detector: "neuraldbg.detectors.Detector",
    CausalRule: "neuraldbg.reasoning.CausalRule",
}


def kinds_of(pm: pluggy.PluginManager) -> list[Kind]:
    """The kinds of ``pm``'s plugins, built-in ones first, each registered (process-wide, by name)."""
    found: list[Kind] = []
    for group in reversed(_results(pm, "neuraldbg_kinds", Kind)):  # pluggy calls the latest registered first
        for room in group:
            registered = registry.register(room)
            if registered not in found:
                found.append(registered)
    return found


def detectors(pm: pluggy.PluginManager, config: DebugConfig) -> list[Detector]:
    """Fresh detectors for a new debugger: the plugins' own, then those of every kind of ``pm``."""
    extra = [d for group in _results(pm, "neuraldbg_detectors", Detector, config=config) for d in group]
    return [*extra, *kind_detectors(config, kinds_of(pm))]


def rules(pm: pluggy.PluginManager, also: Iterable[Kind] = ()) -> list[CausalRule]:
    """The plugins' own causal rules, then those of every kind of ``pm`` and of ``also`` (a saved run's kinds that
    a plugin of this process registered), effects named by state resolved."""
    chosen = kinds_of(pm)
    chosen += [k for k in also if k not in chosen]
    extra = [registry.resolve(r) for group in _results(pm, "neuraldbg_causal_rules", CausalRule) for r in group]
    return [*extra, *kind_rules(chosen)]


__all__ = ["detectors", "kinds_of", "manager", "register_plugin", "rules", "unregister_plugin"]
