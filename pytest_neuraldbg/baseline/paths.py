"""Where a test's baseline lives: ``<test dir>/__neuraldbg__/<module stem>/<test name>.json``."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..names import portable_name

DIRECTORY = "__neuraldbg__"


def file_name(test_id: str) -> str:
    """The baseline file name of a test: ``TestA::test_b[x-1]`` -> ``TestA.test_b[x-1].json``.

    The ``::`` between class and test becomes ``.``; a test name that holds a ``.`` itself (an item a plugin
    collected, such as ``a.b`` beside ``a::b``) ends with a hash of the test id, so no two ids share a file; in a
    parameter id letters, digits and ``. _ - [ ] = + , @`` are kept, and an id with anything else
    ends with a hash of the test id, so ``test[a::b]``, ``test[a/b]`` and ``test[a.b]`` stay distinct, and every
    worker of a session names a test alike without asking the others. Long names are cut and hashed; Windows
    device names get a leading ``_``.
    """
    head, bracket, params = test_id.partition("[")
    text = head.replace("::", ".") + bracket + params
    return portable_name(text, keep="[]=+,@", strip=". ", distinct=True, key=test_id, changed="." in head) + ".json"


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
