"""NeuralDBG: a causal training-health engine for PyTorch.

Wrap an unmodified training loop; ask why it failed::

    from neuraldbg import NeuralDbg

    with NeuralDbg(model) as dbg:
        ...  # your training loop
    for explanation in dbg.explain_failure():
        print(explanation)

Names are loaded on first use: ``import neuraldbg.events`` (the failure vocabulary) does not import torch, so
the pytest plugin and report writers stay light; ``neuraldbg.NeuralDbg`` imports torch the first time.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from .version import __version__

#: Public name -> the submodule that defines it.
_EXPORTS: dict[str, str] = {
    "PRESETS": "config",
    "DebugConfig": "config",
    "NeuralDbg": "debugger",
    "watch": "debugger",
    "ConfigError": "errors",
    "NeuralDbgError": "errors",
    "NeuralDbgWarning": "errors",
    "TraceError": "errors",
    "EventType": "events",
    "FailureKind": "events",
    "SemanticEvent": "events",
    "ActivationHealth": "health",
    "GradientHealth": "health",
    "UpdateHealth": "health",
    "hookimpl": "plugins.hookspecs",
    "register_plugin": "plugins.manager",
    "unregister_plugin": "plugins.manager",
    "CausalHypothesis": "reasoning",
    "CausalRule": "reasoning",
    "Coupling": "reasoning",
    "Trace": "trace",
    "load": "trace",
}

__all__ = [
    "PRESETS",
    "ActivationHealth",
    "CausalHypothesis",
    "CausalRule",
    "ConfigError",
    "Coupling",
    "DebugConfig",
    "EventType",
    "FailureKind",
    "GradientHealth",
    "NeuralDbg",
    "NeuralDbgError",
    "NeuralDbgWarning",
    "SemanticEvent",
    "Trace",
    "TraceError",
    "UpdateHealth",
    "__version__",
    "hookimpl",
    "load",
    "register_plugin",
    "unregister_plugin",
    "watch",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'neuraldbg' has no attribute {name!r}")
    with warnings.catch_warnings():  # torch warns at import when numpy is absent; NeuralDBG does not need numpy
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # the same names, for type checkers and IDEs
    from .config import PRESETS, DebugConfig
    from .debugger import NeuralDbg, watch
    from .errors import ConfigError, NeuralDbgError, NeuralDbgWarning, TraceError
    from .events import EventType, FailureKind, SemanticEvent
    from .health import ActivationHealth, GradientHealth, UpdateHealth
    from .plugins.hookspecs import hookimpl
    from .plugins.manager import register_plugin, unregister_plugin
    from .reasoning import CausalHypothesis, CausalRule, Coupling
    from .trace import Trace, load
