"""Where the plugin keeps its state: ``config.stash`` for the session, ``item.stash`` for a test."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .options import Settings
from .outcomes import Outcomes
from .records import RunRecord

if TYPE_CHECKING:
    from .fixture import NeuralDbgFixture


@dataclass
class SessionState:
    """The session's settings and, on the controller, the record of every watched run and baseline."""

    settings: Settings
    records: list[RunRecord] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)
    unwritten: list[str] = field(default_factory=list)  # output files that could not be written, each with why
    baseline_notes: list[dict[str, Any]] = field(default_factory=list)  # from every test that has a baseline
    deselected: list[tuple[Path, str]] = field(default_factory=list)  # (module, test id) of deselected tests
    stale: dict[str, str] = field(default_factory=dict)  # stale baseline file -> "test_x in test_mod.py"
    removed: list[str] = field(default_factory=list)  # stale baseline files deleted (--neuraldbg-remove-stale-...)
    outcomes: Outcomes = field(default_factory=Outcomes)  # pytest's counts, and each test's outcome
    annotations: list[str] = field(default_factory=list)  # GitHub Actions workflow commands for failed tests
    stopped: str = ""  # why the session stopped before its last test (-x, --maxfail), or ""


SESSION_KEY = pytest.StashKey[SessionState]()
FIXTURE_KEY: pytest.StashKey[NeuralDbgFixture] = pytest.StashKey()
RECORDS_KEY = pytest.StashKey[list[RunRecord]]()  # a test's run records, computed once after its body
