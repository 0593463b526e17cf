"""The plugin's errors, under one root (:class:`PluginError`, itself a :class:`neuraldbg.NeuralDbgError`).

Mistakes in how a test calls the plugin are reported as one message at the test's own line.

The plugin's functions on the way from a test to such an error hide their frames (``__tracebackhide__``), so
pytest shows the test's line and the message, not the plugin's internals. Their frames stay visible when the
error comes from the user's own code they call (a model's ``forward``, a loss function, a DataLoader), where
the way through the plugin is part of the story. Imports no torch.
"""

from __future__ import annotations

from typing import Any

from neuraldbg.errors import NeuralDbgError


class PluginError(NeuralDbgError):
    """Root of every error the pytest plugin raises: bad options, baselines, usage, distributed runs, the gate."""


class UsageProblem(PluginError):
    """Base of the plugin's errors about its arguments (also a ``ValueError`` or ``TypeError``, see below)."""


class ArgumentError(UsageProblem, ValueError):
    """An argument with a value the plugin cannot use; the message names it and says what was expected."""


class ArgumentTypeError(UsageProblem, TypeError):
    """An argument of the wrong type; the message names it and says what was expected."""


def hide_usage_problems(excinfo: Any) -> bool:
    """A ``__tracebackhide__`` value: hide the frame when the error is the plugin's message to the user."""
    return excinfo is not None and isinstance(excinfo.value, UsageProblem)
