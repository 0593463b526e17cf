"""Stale baseline files: files of the collected modules that no test of theirs would use, and removing them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from .paths import DIRECTORY, directory_for, file_name


def stale_files(tests: Iterable[tuple[Path, str]], partial: Callable[[Path], bool]) -> list[tuple[Path, str]]:
    """Baseline files of the collected modules that no collected (or deselected) test of theirs would use.

    ``tests``: ``(module path, test id)`` of every collected and every deselected test. ``partial``: whether
    a module was only partly collected (``test_x.py::test_y`` on the command line); those are skipped.
    Returns ``(file, test id it was written for)``, in file order.
    """
    names: dict[Path, set[str]] = {}
    for module, test_id in tests:
        names.setdefault(module, set()).add(file_name(test_id))
    out: list[tuple[Path, str]] = []
    for module in sorted(names):
        directory = directory_for(module)
        if partial(module) or not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.json")):
            if path.name not in names[module]:
                out.append((path, _written_for(path)))
    return out


def _written_for(path: Path) -> str:
    """The test id stored in the file when it matches the file's name (not a copy); else the name's stem."""
    try:
        test = json.loads(path.read_text(encoding="utf-8")).get("test")
    except (OSError, ValueError, AttributeError):
        test = None
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
