"""Portable file names for test ids: the one rule every file the plugin writes is named by."""

from __future__ import annotations

import hashlib
import re

#: Longest file name written (well under every file system's limit, with room for a suffix).
MAX_NAME = 120
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)), *(f"lpt{i}" for i in range(1, 10))}


def digest(text: str) -> str:
    """Eight hex digits that tell two texts apart."""
    return hashlib.sha1(text.encode("utf-8"), usedforsecurity=False).hexdigest()[:8]


def portable_name(
    text: str,
    *,
    keep: str = "",
    strip: str = "._-",
    max_len: int = MAX_NAME,
    distinct: bool = False,
    key: str = "",
    changed: bool = False,
) -> str:
    """``text`` as a file name any system takes: letters, digits, ``. _ -`` and the characters of ``keep`` remain,
    anything else becomes ``_`` (then ``strip`` is stripped from both ends); Windows device names get a leading
    ``_``; a name longer than ``max_len`` is cut and ends with a hash of ``key`` (default ``text``). ``distinct``:
    a name that had to change ``text`` ends with that hash too, so two texts never share a name; ``changed``: the
    caller already rewrote ``key`` into ``text`` ambiguously, so the hash is due whatever this function changes."""
    unsafe = re.compile(rf"[^A-Za-z0-9._\-{re.escape(keep)}]+")
    name = unsafe.sub("_", text).strip(strip) or "test"
    changed = changed or name != text
    if name.split(".", 1)[0].lower() in _RESERVED:
        name = "_" + name  # a device name on Windows (no other name starts with "_" and reads the same)
    if len(name) > max_len or (distinct and changed):
        name = name[: max_len - 9].rstrip("._-") + "-" + digest(key or text)
    return name
