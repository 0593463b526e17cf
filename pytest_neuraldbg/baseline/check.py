"""One test's baseline: compare its runs with the file, or collect them and write it when updating."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import pytest

from neuraldbg.errors import NeuralDbgWarning
from neuraldbg.export.inert import inert

from ..options import Settings
from .compare import RunComparison, Tolerances, compare_run
from .files import BaselineError, document, load, write
from .summary import Observed
from .texts import (
    environment_text,
    grouped,
    in_run,
    invalid_text,
    missing_text,
    no_run_text,
    regression_lines,
    regression_text,
    unwritable_text,
)


class NeuralDbgBaselineWarning(NeuralDbgWarning):
    """The baseline was recorded in another environment (torch version, device, ...); compared anyway."""


def _test_failure(text: str) -> NoReturn:
    """Fail the running test with ``text`` alone: no traceback (the text says what is wrong and how to fix it)."""
    __tracebackhide__ = True
    pytest.fail(text, pytrace=False)


class BaselineCheck:
    """The baseline of one test: compares runs with its file, or collects them to write it.

    ``notes`` are plain dictionaries for the reports (they travel to the xdist controller on the test's report):
    ``{"nodeid", "path", "status", "lines", "text"}`` with status ``matched``, ``improved``, ``regressed``,
    ``missing``, ``invalid`` (a file that cannot be read, or cannot be written when updating), ``no run`` (the
    test watched no run, or one that took no step), ``created``, ``updated``, ``unchanged`` or ``not written``;
    ``lines`` are what was found (regressions worst first), ``text`` the failure text of a status that failed the
    test. Every text and line is inert (see :mod:`.texts`).
    """

    def __init__(
        self,
        *,
        path: Path,
        shown_path: str,
        nodeid: str,
        test_id: str,
        settings: Settings,
        location: tuple[str, int] | None = None,
    ) -> None:
        self.path = path
        self.location = location  # (file, line) of the test, for warnings raised after its body
        self.shown_path = shown_path
        self.nodeid = nodeid
        self.test_id = test_id
        self.settings = settings
        self.pending: dict[str, dict[str, Any]] = {}
        self.compared: set[str] = set()
        self.notes: list[dict[str, Any]] = []

    @property
    def updating(self) -> bool:
        return bool(self.settings.update_baselines)

    def _note(self, status: str, lines: Iterable[str] = (), text: str = "") -> None:
        shown = [inert(line) for line in lines]  # names from the model or the file, as visible escapes
        note = {"nodeid": self.nodeid, "path": self.shown_path, "status": status, "lines": shown, "text": text}
        self.notes.append(note)

    def no_run(self, fail: Callable[[str], NoReturn], *, marker: bool) -> NoReturn:
        """Fail a baseline test that watched no training run: nothing to compare, nothing written."""
        __tracebackhide__ = True
        text = no_run_text(self.nodeid, marker)
        self._note("no run", [text.split("\n", 1)[0]], text)
        fail(text)

    def check(self, observed: Mapping[str, Observed], *, complete: bool, fail: Callable[[str], NoReturn]) -> None:
        """Compare ``observed`` runs with the file (or keep them for writing when updating).

        ``complete``: these are all the runs of the test, so runs in the file that were not observed are
        missing. ``fail`` raises the test's failure with the text it is given.
        """
        __tracebackhide__ = True
        self.compared.update(observed)
        empty = [name for name, run in observed.items() if not run.summary.get("steps_observed")]
        if empty:  # no step: no statistics to compare or to store
            text = no_run_text(self.nodeid, False, empty)
            self._note("no run", [text.split("\n", 1)[0]], text)
            fail(text)
        if self.updating:
            self.pending.update({name: o.summary for name, o in observed.items()})
            return
        try:
            doc, problem = load(self.path), ""
        except BaselineError as exc:
            doc, problem = None, str(exc)
        if problem:  # failed outside the except block: the reader's error is no part of the test's failure
            text = invalid_text(self.shown_path, self.nodeid, problem)
            self._note("invalid", [problem], text)
            fail(text)
        if doc is None:
            if not observed:  # nothing watched and nothing stored: nothing to compare
                return
            text = missing_text(self.shown_path, self.nodeid)
            self._note("missing", [text.split("\n", 1)[0]], text)
            fail(text)
        stored: dict[str, Any] = doc["runs"]
        several = len(set(stored) | set(observed) | self.compared) > 1
        problems: list[str] = []
        comparisons: list[RunComparison] = []
        for name, run in observed.items():
            if name not in stored:
                problems.append(
                    f"run {name!r} has no baseline in this file (runs there: {', '.join(stored) or 'none'})"
                )
                continue
            comparisons.append(compare_run(name, stored[name], run.summary, Tolerances.of(self.settings)))
        if complete:
            problems += [
                f"run {name!r} is in the baseline but the test did not watch it"
                for name in stored
                if name not in self.compared
            ]
        differences = [f"{in_run(c.run, several)}{d}" for c in comparisons for d in c.environment]
        if differences:
            warning = NeuralDbgBaselineWarning(environment_text(self.shown_path, differences))
            if self.location is not None and complete:  # after the test body: point at the test, not the plugin
                warnings.warn_explicit(warning, NeuralDbgBaselineWarning, *self.location)
            else:
                warnings.warn(warning, stacklevel=3)  # at the assert_matches_baseline() call
        regressions = [r for c in comparisons for r in c.regressions]
        improvements = [f"{in_run(c.run, several)}{line}" for c in comparisons for line in grouped(c.improvements)]
        if problems or regressions:
            text = regression_text(
                comparisons,
                problems,
                path=self.shown_path,
                nodeid=self.nodeid,
                hypotheses={name: o.hypotheses for name, o in observed.items()},
                several=several,
            )
            self._note("regressed", [*problems, *regression_lines(comparisons, several, per_group=True)], text)
            fail(text)
        self._note("improved" if improvements else "matched", improvements)

    def finish(self, passed: bool, due: bool = False, *, fail: Callable[[str], NoReturn] = _test_failure) -> None:
        """At the end of the test body: write the collected runs when updating (only if the test passed).

        ``due``: runs were to be written although none was collected (``baseline=True`` and a failed body).
        A file that cannot be written (a folder or a link in its place, a folder that cannot be created) fails
        the test through ``fail``, with the file, what is wrong and how to fix it; its status is ``invalid``.
        """
        __tracebackhide__ = True
        if not self.updating or not (self.pending or due):
            return
        runs, self.pending = self.pending, {}
        if not passed:
            self._note("not written", ["the test did not pass"])
            return
        try:
            status, problem = write(self.path, document(self.test_id, runs)), ""
        except BaselineError as exc:
            status, problem = "invalid", str(exc)
        if problem:  # failed outside the except block: the writer's error is no part of the test's failure
            text = unwritable_text(self.shown_path, self.nodeid, problem)
            self._note(status, [problem], text)
            fail(text)
        self._note(status)
