"""NeuralDBG: a causal training-health engine for PyTorch.

Wrap an unmodified training loop; ask why it failed::

    from neuraldbg import NeuralDbg

    with NeuralDbg(model) as dbg:
        ...  # your training loop
    for explanation in dbg.explain_failure():
        print(explanation)
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():  # torch warns at import when numpy is absent; NeuralDBG does not need numpy
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch  # noqa: F401

from .config import PRESETS, DebugConfig
from .debugger import NeuralDbg, __version__, watch
from .errors import ConfigError, NeuralDbgError, NeuralDbgWarning, TraceError
from .events import EventType, FailureKind, SemanticEvent
from .health import ActivationHealth, GradientHealth, UpdateHealth
from .hookspecs import hookimpl
from .plugins import register_plugin, unregister_plugin
from .reasoning import CausalHypothesis, CausalRule, Coupling
from .tracefile import Trace, load

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
