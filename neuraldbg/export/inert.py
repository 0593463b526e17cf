"""Text from a model or a test (layer names, test ids, paths) made inert before people read it.

A layer name is anything a user or a crafted trace put there: an ESC sequence that erases the terminal's previous
line and prints a fake verdict, a right-to-left override that makes ``'fc1'`` read as another name, a newline that
starts a line of its own, a lone surrogate that no encoder accepts (the report's end, or pytest-xdist's channel,
fails on it). Every output meant for people (terminal, CLI, Markdown, HTML, JUnit text, Mermaid labels) passes such
text through :func:`inert`, which writes these characters as visible escapes (``\\x1b``, ``\\u202e``, ``\\udc80``) and
leaves every other character as it is, so names stay recognisable.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Any

#: Characters that reorder or hide text: the bidirectional embeddings, overrides, isolates and marks.
BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_CONTROL = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029]


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_TABLE: dict[int, str] = {code: _escape(code) for code in (*_CONTROL, *BIDI, *range(0xD800, 0xE000))}
_LINES_TABLE = {code: text for code, text in _TABLE.items() if code != 0x0A}


def inert(text: str, *, lines: bool = False) -> str:
    """``text`` with control, bidirectional and lone surrogate characters written as visible escapes.

    ``lines``: keep line feeds (text of several lines whose line structure is ours); otherwise a line feed is
    escaped too, so the result is one line.
    """
    return text.translate(_LINES_TABLE if lines else _TABLE)


def encodable(text: str) -> str:
    """``text`` with lone surrogates escaped (``\\udc80``): what any UTF-8 encoder, and xdist's channel, accepts."""
    if text.isascii():
        return text
    return "".join(_escape(ord(c)) if unicodedata.category(c) == "Cs" else c for c in text)


def strings(value: Any, change: Callable[[str], str]) -> Any:
    """Plain JSON-like data (dicts, lists, strings, numbers) with ``change`` applied to every string, keys included."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {strings(k, change): strings(v, change) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strings(v, change) for v in value]
    return value


def encodable_data(value: Any) -> Any:
    """Plain JSON-like data with every string, keys included, :func:`encodable`."""
    return strings(value, encodable)


def inert_data(value: Any) -> Any:
    """Plain JSON-like data with every string, keys included, :func:`inert` (one line each)."""
    return strings(value, inert)
