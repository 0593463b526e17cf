"""Stale baseline files: files of the collected modules that no test of theirs would use, and removing them."""

from __future__ import annotations

import glob
from collections.abc import Callable, Iterable
from pathlib import Path

from .files import BaselineError, read_document
from .paths import DIRECTORY, directory_for, file_name


def stale_files(tests: Iterable[tuple[Path, str]], partial: Callable[[Path], bool]) -> list[tuple[Path, str]]:
    """Baseline files of the collected modules that no collected (or deselected) test of theirs would use.

    ``tests``: ``(module path, test id)`` of every collected and every deselected test. ``partial``: whether
    a module was only partly collected (``test_x.py::test_y`` on the command line); those are skipped.
    Returns ``(file, test id it was written for)``, in file order.
    """
    ids: dict[Path, list[str]] = {}
    for module, test_id in tests:
        ids.setdefault(module, []).append(test_id)
    out: list[tuple[Path, str]] = []
    for module in sorted(ids):
        directory = directory_for(module)
        if partial(module) or not directory.is_dir():
            continue
        names = {file_name(test_id) for test_id in ids[module]}  # only where baselines are kept: most modules have none
        for path in sorted(directory.glob("*.json")):
            if path.name not in names:
                out.append((path, _written_for(path)))
    collected = {directory_for(module) for module in ids}
    for folder in sorted({directory.parent for directory in collected}):
        out += _of_deleted_modules(folder, collected)
    return out


def _of_deleted_modules(folder: Path, collected: set[Path]) -> list[tuple[Path, str]]:
    """The baseline files in ``folder`` (a ``__neuraldbg__``) of test modules that no longer exist beside it (no file
    of that stem): every test of theirs is gone, whatever this session selected."""
    if not folder.is_dir():
        return []
    out: list[tuple[Path, str]] = []
    for directory in sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink() and p not in collected):
        if any(p.is_file() for p in folder.parent.glob(glob.escape(directory.name) + ".*")):
            continue  # its module (test_x.py, or a file another collector reads) is still there
        out += [(path, _written_for(path)) for path in sorted(directory.glob("*.json"))]
    return out


def _written_for(path: Path) -> str:
    """The test id stored in the file when it matches the file's name (not a copy); else the name's stem."""
    try:
        doc = read_document(path)
    except BaselineError:
        doc = None
    test = doc.get("test") if isinstance(doc, dict) else None
    return test if isinstance(test, str) and file_name(test) == path.name else path.stem


def remove(path: Path) -> bool:
    """Delete a stale baseline file, then its module's folder and ``__neuraldbg__`` when they are left empty.

    Only ``__neuraldbg__/<module>/<test>.json`` files are touched; returns whether the file was deleted.
    """
    if path.suffix != ".json" or path.parent.parent.name != DIRECTORY or not path.is_file():
        return False
    path.unlink()
    for folder in (path.parent, path.parent.parent):
        try:
            folder.rmdir()  # only succeeds when empty
        except OSError:
            break
    return True
