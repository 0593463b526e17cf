"""The one way NeuralDBG writes a file: whole or not at all, and only over a regular file.

Every file the project writes (traces, baselines, summary.md, JUnit files, graphs, pictures, HTML reports) goes
through :func:`write_atomic`: the bytes go to a temporary file in the target's own folder, are flushed and synced to
disk, and the temporary file is renamed over the target. A process killed at any moment leaves either the previous
file or the new one, never a torn or empty one; a reader sees one of the two.

Only regular files are replaced. A path that names a device (``/dev/null``, ``/dev/full``, ``/dev/stdout``), a FIFO,
a socket, a directory or a symbolic link is refused with :class:`OutputError` before anything is written: renaming
over it would replace the device node or the link itself (as root, ``/dev/null`` would become a regular file).

A temporary file is named ``.neuraldbg-tmp-<pid>-<random>.tmp``: hidden, never ``*.json`` or ``*.md``, so no reader
that lists a folder takes it for a result. One left behind by a killed process is removed by
:func:`clean_temporary` (called for every folder written to) once its process is gone.

Two sessions that write one report folder at the same time take turns: :func:`folder_lock` holds an advisory lock on
the folder itself (no lock file is left in it) around a session's whole set of files, so a folder never mixes one
session's summary with another's pictures, and each file is one session's whole.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import NeuralDbgError
from ..text import printable

TEMP_PREFIX = ".neuraldbg-tmp-"
TEMP_SUFFIX = ".tmp"
#: A temporary file older than this is removed even when its process id is alive again (a reused pid).
TEMP_MAX_AGE = 24 * 3600.0
_TEMP_NAME = re.compile(re.escape(TEMP_PREFIX) + r"(\d+)-[0-9a-f]+" + re.escape(TEMP_SUFFIX) + r"\Z")

_NOT_REGULAR = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


class OutputError(NeuralDbgError, OSError):
    """A file cannot be written where it was asked: the message names the path, what is there and what was
    expected."""


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file, existing or not: the same path once links and ``..`` are resolved, or, for
    files that exist, the same file (a hard link). A path that cannot be looked at names no file of the other."""
    try:
        return os.path.realpath(a) == os.path.realpath(b) or os.path.samefile(a, b)
    except (OSError, ValueError):  # one of them does not exist (or is no valid path)
        return False


def check_target(path: str | os.PathLike[str]) -> Path:
    """``path`` as a :class:`Path` when a regular file may be written there (nothing there yet, or a regular file);
    else :class:`OutputError` naming what is there."""
    target = Path(path)
    shown = printable(os.fspath(target))
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise OutputError(f"{shown}: cannot be written: {exc.strerror or exc}") from None
    except ValueError:  # a NUL character in the path
        raise OutputError(f"{shown}: not a valid file name (it contains a NUL character)") from None
    if stat.S_ISLNK(info.st_mode):
        raise OutputError(
            f"{shown}: is a symbolic link; NeuralDBG writes only regular files, so that it never replaces a link "
            "or what it points to: give the path of a regular file"
        )
    if not stat.S_ISREG(info.st_mode):
        what = next((name for test, name in _NOT_REGULAR if test(info.st_mode)), "not a regular file")
        raise OutputError(f"{shown}: is {what}; expected the path of a regular file to write")
    return target


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, mode: int | None = None) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` atomically; returns the path. Creates missing folders.

    ``mode``: the new file's permissions; default those of the file it replaces, else ``0o666`` less the umask.
    Raises :class:`OutputError` for a target that is not a regular file or cannot be written.
    """
    target = check_target(path)
    shown = printable(os.fspath(target))
    # text: UTF-8; a lone surrogate (from a layer name) is written escaped rather than failing the write
    payload = data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data
    folder = target.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{shown}: cannot create its folder: {exc.strerror or exc}") from None
    clean_temporary(folder)
    if mode is None:
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except OSError:
            mode = 0o666 & ~_umask()
    temporary = folder / f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}{TEMP_SUFFIX}"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
    except OSError as exc:
        raise OutputError(f"{shown}: cannot be written: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        check_target(target)  # what is there now: a link or device put there meanwhile is not replaced either
        os.replace(temporary, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError) and not isinstance(exc, OutputError):
            raise OutputError(f"{shown}: cannot be written: {exc.strerror or exc}") from None
        raise
    _sync_folder(folder)
    return target


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def is_temporary(name: str) -> bool:
    """Whether a file name is one of :func:`write_atomic`'s temporary files."""
    return bool(_TEMP_NAME.match(name))


def clean_temporary(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files a killed writer left in ``folder`` (its process gone, or a day old); returns them.

    Another process's file still being written is left alone. Never raises: cleaning is a courtesy.
    """
    removed: list[Path] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        found = _TEMP_NAME.match(name)
        if found is None:
            continue
        path = Path(folder) / name
        try:
            old = now - os.lstat(path).st_mtime > TEMP_MAX_AGE
            if old or not _alive(int(found.group(1))):
                path.unlink()
                removed.append(path)
        except OSError:
            continue
    return removed


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike[str], timeout: float = 60.0) -> Iterator[None]:
    """Hold an advisory lock on ``folder`` while writing a set of files that belong together.

    Two sessions sharing the folder take turns; after ``timeout`` seconds of waiting the files are written anyway
    (each of them still whole). Where folders cannot be locked (Windows), nothing is locked.
    """
    try:
        import fcntl
    except ImportError:  # Windows: each file is still written whole
        yield
        return
    os.makedirs(folder, exist_ok=True)
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the lock
