"""The exceptions and warnings NeuralDBG raises.

Every error derives from :class:`NeuralDbgError`; leaves also derive from the builtin a caller would expect
(``ConfigError`` is a ``ValueError``), so ``except ValueError`` keeps working.
"""

from __future__ import annotations


class NeuralDbgError(Exception):
    """Root of every error NeuralDBG raises."""


class ConfigError(NeuralDbgError, ValueError):
    """A configuration value is malformed: the message names the value, its source and what was expected."""


class TraceError(NeuralDbgError, ValueError):
    """A trace file cannot be read: the message names the file and what is wrong with it."""


class NeuralDbgWarning(UserWarning):
    """NeuralDBG could not observe part of a run. Training itself is never affected."""
