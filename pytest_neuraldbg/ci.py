"""CI-native output: GitHub Actions workflow annotations for unhealthy tests, and progress lines for long runs.

Under GitHub Actions (``GITHUB_ACTIONS=true``) each failed test with an unhealthy watched run gets an ``::error``
workflow command at the test's line, with the one-line verdict, so the pull request's diff view shows it. The
values are escaped as GitHub's runner reads workflow commands: in the message ``%``, CR and LF; in the properties
``%``, CR, LF, ``:`` and ``,`` too. Printed by the controller (xdist workers' output is not shown), after the tests.

Progress: a long ``smoke_train`` is not silent. Under ``-v``, or once a run has lasted :data:`QUIET_FOR` seconds,
a line ``neuraldbg: <test>: step 300/1500, loss 0.123 (12.4 s)`` is written at most every :data:`EVERY` seconds,
to the terminal, with output capture suspended as pytest's live logging does, never into the captured output that
hides it. Imports no torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from neuraldbg.export.inert import inert
from neuraldbg.text import num, one_line

from .records import UNHEALTHY, RunRecord
from .verdict import MAX_HEADLINE, headline

QUIET_FOR = 5.0  # seconds a run trains before it reports progress without -v
EVERY = 5.0  # seconds between two progress lines
EVERY_VERBOSE = 1.0  # the same under -v


def on_github(env: Any = None) -> bool:
    return (os.environ if env is None else env).get("GITHUB_ACTIONS", "").strip().lower() == "true"


def escape_data(text: str) -> str:
    """A workflow command's message, as GitHub's runner reads it back."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value (``file``, ``title``)."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(path: str, line: int, recs: Sequence[RunRecord]) -> str | None:
    """The ``::error`` command for a failed test with unhealthy runs (None without one)."""
    unhealthy = [h for r in recs if r["verdict"] == UNHEALTHY for h in r["hypotheses"]]
    if not unhealthy:
        return None
    message = inert(one_line(headline(unhealthy), MAX_HEADLINE))
    where = f"file={escape_property(path)},line={max(1, line)},title={escape_property('NeuralDBG')}"
    return f"::error {where}::{escape_data(message)}"


class Progress:
    """Progress lines of one watched training run, written to the terminal past output capture."""

    def __init__(self, config: Any, label: str, total: int, clock: Any = time.monotonic) -> None:
        self.config = config
        self.label = inert(label)
        self.total = total
        self.clock = clock
        self.start = clock()
        self.verbose = int(getattr(config.option, "verbose", 0) or 0) > 0
        self.last = self.start
        self.lines = 0

    def __call__(self, step: int, loss: Any = None) -> None:
        """After each training step (``step`` counts from 1); ``loss`` (a tensor) is read only when a line is due."""
        now = self.clock()
        every = EVERY_VERBOSE if self.verbose else EVERY
        if not self.verbose and now - self.start < QUIET_FOR:
            return
        if now - self.last < every and step != self.total and (self.lines or not self.verbose):
            return  # under -v the first step is shown at once
        if step == self.total and self.lines == 0 and not self.verbose:
            return  # finished before its first progress line: nothing to add
        self.last = now
        shown = f", loss {num(float(loss))}" if loss is not None else ""
        self.write(f"neuraldbg: {self.label}: step {step}/{self.total}{shown} ({now - self.start:.1f} s)")

    def finish(self, found: Sequence[str]) -> None:
        """After the run: its verdict, when progress was shown."""
        if self.lines:
            state = "healthy" if not found else "unhealthy: " + "; ".join(found[:2])
            self.write(f"neuraldbg: {self.label}: done, {inert(state)}")

    def write(self, text: str) -> None:
        self.lines += 1
        capture = self.config.pluginmanager.getplugin("capturemanager")
        writer = self.config.get_terminal_writer()
        if capture is not None:
            with capture.global_and_fixture_disabled():
                self._line(writer, text)
        else:
            self._line(writer, text)

    @staticmethod
    def _line(writer: Any, text: str) -> None:
        if getattr(writer, "width_of_current_line", 0):
            writer.line()  # after the progress dots of pytest's own line
        writer.line(text, cyan=True)
