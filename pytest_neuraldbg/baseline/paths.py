"""Where a test's baseline lives: ``<test dir>/__neuraldbg__/<module stem>/<test name>.json``."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

DIRECTORY = "__neuraldbg__"
_UNSAFE = re.compile(r"[^A-Za-z0-9._\-\[\]=+,@]+")
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)), *(f"lpt{i}" for i in range(1, 10))}
MAX_NAME = 120


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8"), usedforsecurity=False).hexdigest()[:8]


def file_name(test_id: str) -> str:
    """The baseline file name of a test: ``TestA::test_b[x-1]`` -> ``TestA.test_b[x-1].json``.

    Letters, digits and ``. _ - [ ] = + , @`` are kept; anything else becomes ``_`` and the name then ends
    with a hash of the test id, so that ``test[a/b]`` and ``test[a_b]`` stay distinct. Long names are cut
    (and hashed); Windows device names get a leading ``_``.
    """
    name = test_id.replace("::", ".")
    safe = _UNSAFE.sub("_", name).strip(". ") or "test"
    if safe != name or len(safe) > MAX_NAME:
        safe = safe[: MAX_NAME - 9].rstrip("._-") + "-" + _digest(test_id)
    if safe.split(".", 1)[0].lower() in _RESERVED:
        safe = "_" + safe
    return safe + ".json"


def locate(item: pytest.Item) -> tuple[Path, str]:
    """The test module's path and the test's id inside it: ``TestA::test_b[x-1]``."""
    module = item.getparent(pytest.Module)
    if module is not None and item.nodeid.startswith(module.nodeid + "::"):
        return module.path, item.nodeid[len(module.nodeid) + 2 :]
    return item.path, item.name


def directory_for(module: Path) -> Path:
    """``tests/test_x.py`` -> ``tests/__neuraldbg__/test_x``."""
    return module.parent / DIRECTORY / module.stem


def path_for(module: Path, test_id: str) -> Path:
    return directory_for(module) / file_name(test_id)


def shown(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` when below it (posix separators), else absolute."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)
