"""Reading a saved trace back: ``neuraldbg.load(path)`` returns a :class:`Trace` with the debugger's query
methods (``explain_failure()``, ``hypotheses()``, ``export_mermaid_causal_graph()``, ...).

A trace may come from anywhere (a CI artifact, a colleague, a path typed by hand), so reading it never blocks and
never reads without bound: only regular files are opened (a FIFO, a device, or a symbolic link to one is refused
before opening, and the file is opened non-blocking and checked again), at most ``max_bytes`` are read, and every
field is checked before a :class:`Trace` is built (see :func:`neuraldbg.export.trace_format.parse`).
"""

from __future__ import annotations

import operator
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .config import DebugConfig
from .errors import ConfigError, TraceError
from .events import SemanticEvent
from .export import trace_format
from .kinds import registry
from .plugins import manager
from .queries import Queries
from .reasoning import CausalRule, Topology
from .stats.history import History
from .text import printable

#: Largest trace read by default: 64 MiB. A trace is small by construction (at most ``max_events`` events, history
#: series of at most ``history_points`` points each): measured, a 101-module MLP after 600 fully observed steps
#: writes 1.7 MB, about 17 KB per module, nearly all of it history, so 64 MiB holds the trace of a model with about
#: 3,900 modules. The cap bounds what a hostile or mistaken file can cost (a parsed trace takes several times its
#: size in memory); ``load(path, max_bytes=...)`` and ``neuraldbg explain --max-bytes`` raise it.
MAX_TRACE_BYTES = 64 * 1024 * 1024


class Trace(Queries):
    """A finished run read from a JSON trace file."""

    def __init__(self, doc: dict[str, Any], source: str, plugins_: Iterable[Any] = ()) -> None:
        self.source = source
        self.config = DebugConfig().replace(**doc["config"])
        self._doc_meta: dict[str, Any] = doc["meta"]
        self._events: list[SemanticEvent] = doc["events"]
        layers = doc["layers"]
        self._layers_meta = layers
        self._topo = Topology(
            order=doc["order"],
            types={str(x["name"]): str(x["type"]) for x in layers},
            roles={str(x["name"]): str(x.get("role", "other")) for x in layers},
            first_step=0,
            last_step=int(doc["meta"].get("last_step", -1)),
            calls=dict(doc.get("calls", {})),
        )
        self.history = History.from_json(doc["history"], self.config.history_points)
        reported = {e.kind for e in self._events if e.kind is not None}
        registered = [registry.room(k) for k in reported if registry.is_known(k)]  # a plugin of this process
        self._rules: list[CausalRule] = manager.rules(manager.manager(plugins_), registered)

    def _current(self) -> tuple[list[SemanticEvent], Topology, Sequence[CausalRule]]:
        return self._events, self._topo, self._rules

    def _meta(self) -> dict[str, Any]:
        return {**self._doc_meta, "config": self.config.as_dict(), "layers": self._layers_meta}

    @property
    def steps(self) -> int:
        return int(self._doc_meta.get("steps_observed", 0))

    def __repr__(self) -> str:
        return f"<neuraldbg.Trace {self.source!r}: {len(self._events)} events>"


_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


#: How a reader reports a problem with a file: given the problem in words (``is a FIFO ...``), the exception to raise.
Failure = Callable[[str], Exception]


def _refuse_unless_regular(fail: Failure, what: str, mode: int, via_link: bool) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise fail(f"is a directory, expected a JSON {what} file")
    kind = next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")
    link = " (through a symbolic link)" if via_link else ""
    raise fail(f"is {kind}{link}, not a regular file; expected a JSON {what} file")


_TRACE_LIMIT_HINT = " (raise the limit with load(path, max_bytes=N) or neuraldbg explain --max-bytes N)"


def read_text(
    source: str,
    max_bytes: int = MAX_TRACE_BYTES,
    *,
    what: str = "trace",
    fail: Failure | None = None,
    limit_hint: str = _TRACE_LIMIT_HINT,
) -> str:
    """The text of a JSON file from anywhere, read without blocking and without reading more than ``max_bytes``.

    The one guarded reader of the project (traces, and the plugin's baselines): only a regular file is opened, a
    FIFO, a device or a link to one is refused before opening. ``what`` names the kind of file in messages; ``fail``
    turns a problem into the exception raised (default: a :class:`TraceError` naming the file).
    """
    max_bytes = byte_limit(max_bytes, "max_bytes")
    shown = printable(source)
    if fail is None:

        def fail(problem: str) -> Exception:
            return TraceError(f"{shown}: {problem}")

    via_link = os.path.islink(source)
    info = _os_call(fail, what, via_link, os.stat, source)  # follows symbolic links: what open() would reach
    _refuse_unless_regular(fail, what, info.st_mode, via_link)
    if info.st_size > max_bytes:
        raise fail(f"is {info.st_size} bytes, more than the {max_bytes} a {what} may have{limit_hint}")
    # O_NONBLOCK: should the path be swapped for a FIFO after the check above, opening it does not block
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = _os_call(fail, what, via_link, os.open, source, flags)
    with os.fdopen(fd, "rb") as fh:
        _refuse_unless_regular(fail, what, os.fstat(fh.fileno()).st_mode, via_link)
        data = _read_at_most(fh, max_bytes + 1, lambda size: _os_call(fail, what, via_link, fh.read, size))
    if len(data) > max_bytes:
        raise fail(f"holds more than the {max_bytes} bytes a {what} may have")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise fail(f"not a text file ({exc.reason} at byte {exc.start}); expected JSON") from None


#: Bytes asked of the file per read. ``read(n)`` sets aside ``n`` bytes before reading, so one read of the limit
#: (which may be raised to terabytes) would fail on memory for a file of a few kilobytes; reading in steps costs
#: only what the file holds.
_READ_STEP = 4 * 1024 * 1024


def _read_at_most(fh: Any, limit: int, read: Callable[[int], bytes]) -> bytes:
    """Up to ``limit`` bytes of an open file, in steps of at most :data:`_READ_STEP`: a file of unknown size
    (``/proc``) or one that grows while read stops at the limit, and memory follows what is actually there."""
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        chunk = read(min(limit - got, _READ_STEP))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def byte_limit(value: Any, where: str) -> int:
    """``value`` as a limit in bytes: a whole number of at least 1, else :class:`~neuraldbg.ConfigError` naming it.

    A limit is the caller's argument, not part of any file, so a bad one is a ``ConfigError`` (a ``ValueError``):
    ``None``, ``"100"``, ``1.5``, ``True``, ``0`` and ``-1`` are refused rather than read as something else.
    """
    if not isinstance(value, bool):
        try:
            number = operator.index(value)  # int, or an integer type such as numpy.int64; never a float
        except TypeError:
            pass
        else:
            if number >= 1:
                return number
    raise ConfigError(f"{where}: expected a whole number of bytes, at least 1, got {value!r:.60}")


def _os_call(fail: Failure, what: str, via_link: bool, call: Any, *args: Any) -> Any:
    """``call(*args)``, with the operating system's refusals as ``fail`` lines."""
    try:
        return call(*args)
    except (FileNotFoundError, NotADirectoryError):
        dangling = " (a symbolic link to nothing)" if via_link else ""
        raise fail(f"no such {what} file{dangling}") from None
    except OSError as exc:
        raise fail(f"cannot read the {what} file: {exc.strerror or exc}") from None
    except ValueError:  # os.stat and os.open refuse a NUL character in the path
        raise fail("not a valid file name (it contains a NUL character)") from None


def load(path: str | os.PathLike[str], plugins: Iterable[Any] = (), *, max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """Read a trace written by ``dbg.save(path)``.

    Raises :class:`~neuraldbg.TraceError`, and nothing else, for anything wrong with the file: its message is one
    line naming the file, where in it the problem is and what was expected. A trace that loads answers every query.
    ``max_bytes`` (a whole number, at least 1; else :class:`~neuraldbg.ConfigError`) bounds what is read, never
    what is set aside: a huge limit costs nothing on a small file.
    """
    source = os.fspath(path)
    max_bytes = byte_limit(max_bytes, "neuraldbg.load(): max_bytes")
    return Trace(trace_format.parse(read_text(source, max_bytes), source), source, plugins)
