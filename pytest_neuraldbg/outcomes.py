"""Test outcomes as pytest counts them, so that every report agrees with pytest's own summary line.

The controller sees every test report (from xdist workers too) in ``pytest_runtest_logreport``; each report is
counted the way pytest's terminal counts it: a call that passed is ``passed`` (``xpassed`` under a non-strict
xfail), one that failed ``failed`` (a strict XPASS is a failure), one skipped ``skipped`` or ``xfailed``; a
setup or teardown that failed is an ``error``. Per test, the outcome shown is that of its call, or ``error``
when its setup or teardown failed. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The order of pytest's own summary line ("2 failed, 3 passed, 1 xfailed").
ORDER = ("failed", "passed", "skipped", "xfailed", "xpassed", "error")
BAD = ("failed", "error")  # outcomes that make a session red


def category(report: Any) -> str | None:
    """How pytest's terminal counts this report, or None when it does not count it (a passing setup)."""
    if report.outcome not in ("passed", "failed", "skipped"):
        return None  # e.g. "rerun" of pytest-rerunfailures
    expected_failure = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            return "xpassed" if expected_failure else "passed"
        if report.failed:
            return "failed"
        return "xfailed" if expected_failure else "skipped"
    if report.failed:
        return "error"
    if report.skipped:
        return "xfailed" if expected_failure else "skipped"
    return None


@dataclass
class Outcomes:
    """pytest's counts for the session, and the outcome of each test by node id."""

    counts: dict[str, int] = field(default_factory=dict)
    tests: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)  # a failed test's failure: its first report's message

    def add(self, report: Any) -> None:
        found = category(report)
        if found is None:
            return
        self.counts[found] = self.counts.get(found, 0) + 1
        nodeid = str(report.nodeid)
        if found in BAD and nodeid not in self.messages:
            self.messages[nodeid] = failure_message(report)
        if found == "error" or self.tests.get(nodeid) != "error":
            self.tests[nodeid] = found

    def of(self, nodeid: str) -> str:
        return self.tests.get(nodeid, "")

    def text(self) -> str:
        """``2 failed, 3 passed, 1 xfailed, 1 error``: pytest's words, in pytest's order."""
        parts = []
        for key in ORDER:
            n = self.counts.get(key, 0)
            if n:
                parts.append(f"{n} {'errors' if key == 'error' and n != 1 else key}")
        return ", ".join(parts)


#: Longest failure text kept for a report, in characters.
MAX_MESSAGE = 2000


def failure_message(report: Any) -> str:
    """The failure of a test report as people read it: pytest's crash message with its location, else the start of
    the failure text."""
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = str(getattr(crash, "message", "") or "") or str(
        getattr(report, "longreprtext", "") or getattr(report, "longrepr", "") or ""
    )
    if len(text) > MAX_MESSAGE:
        text = text[: MAX_MESSAGE - 1] + "…"
    where = f"{crash.path}:{crash.lineno}" if crash is not None and getattr(crash, "path", None) else ""
    return f"{text}\n({where})" if where else text


@dataclass(frozen=True)
class BaselineResult:
    """One test's baseline outcome: ``status`` (see :mod:`pytest_neuraldbg.baseline.check`), what it found
    (worst first), the file, and the failure text when it failed the test."""

    status: str
    lines: Sequence[str] = ()
    path: str = ""
    text: str = ""

    @property
    def failed(self) -> bool:
        return self.status in FAILING_BASELINE


#: Baseline statuses that fail their test.
FAILING_BASELINE = ("regressed", "invalid", "missing", "no run")
#: Per test, the status that wins when several runs were compared one by one: the most urgent first.
BASELINE_ORDER = ("regressed", "invalid", "missing", "no run", "not written", "improved", "created", "updated")


def baseline_status(notes: Sequence[Mapping[str, Any]]) -> str:
    statuses = [n["status"] for n in notes]
    return next((s for s in BASELINE_ORDER if s in statuses), statuses[-1] if statuses else "")


def baseline_results(notes: Sequence[Mapping[str, Any]]) -> dict[str, BaselineResult]:
    """Per test node id, its baseline result from the notes of its checks."""
    per_test: dict[str, list[Mapping[str, Any]]] = {}
    for note in notes:
        per_test.setdefault(str(note["nodeid"]), []).append(note)
    out = {}
    for nodeid, found in per_test.items():
        status = baseline_status(found)
        winning = [n for n in found if n["status"] == status]
        out[nodeid] = BaselineResult(
            status,
            [line for n in winning for line in n.get("lines", [])],
            str(found[0].get("path", "")),
            "\n\n".join(str(n["text"]) for n in winning if n.get("text")),
        )
    return out
