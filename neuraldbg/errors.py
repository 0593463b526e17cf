"""The exceptions and warnings NeuralDBG raises.

Every error derives from :class:`NeuralDbgError`; leaves also derive from the builtin a caller would expect
(``ConfigError`` is a ``ValueError``), so ``except ValueError`` keeps working.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class NeuralDbgError(Exception):
    """Root of every error NeuralDBG raises."""


class ConfigError(NeuralDbgError, ValueError):
    """A configuration value is malformed: the message names the value, its source and what was expected."""


class TraceError(NeuralDbgError, ValueError):
    """A trace file cannot be read: the message names the file and what is wrong with it."""


class NeuralDbgWarning(UserWarning):
    """NeuralDBG could not observe part of a run. Training itself is never affected."""


def did_you_mean(value: object, choices: Iterable[str]) -> str:
    """`` (did you mean 'persistence'?)`` for the valid name closest to a misspelt ``value``, or ``""`` when none
    is close: difflib's similarity ratio of at least 0.6, else the one name that starts with ``value`` (``'dead'``
    for ``'dead_units'``), compared case-insensitively. Every message about an unknown name appends it, so a
    typo names its fix wherever it was made."""
    text = str(value).lower()
    by_lower: dict[str, str] = {}
    for choice in choices:
        by_lower.setdefault(choice.lower(), choice)
    close = difflib.get_close_matches(text, list(by_lower), n=1)
    if not close and len(text) >= 3:
        close = [c for c in by_lower if c.startswith(text)]
    return f" (did you mean {by_lower[close[0]]!r}?)" if len(close) == 1 else ""
