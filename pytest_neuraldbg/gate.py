"""The gate (``--neuraldbg-gate=fail``): a test whose watched training is unhealthy fails.

The gate fails the test in its call phase, right after the test body returned, as an assertion at the end of
the test would. So ``xfail`` sees the failure (an unhealthy run under ``xfail(strict=True)`` is XFAIL, a
healthy one XPASS(strict)), a body that failed keeps its own failure (the explanation then comes as a report
section), and a baseline check that fails after the same body is reported in the same failure, both verdict
lines first. ``gate=warn`` only reports; ``@pytest.mark.neuraldbg(gate="off")`` turns it off for a test.

Expected failures: a test that asserted on a failure and expected it is not failed again. When an assertion
helper (``assert_no_dead_neurons``, ``assert_healthy``, ``assert_learns``, ...) raised its ``AssertionError``
on a run's failure and the test passed anyway, the test caught that error on purpose
(``with pytest.raises(AssertionError, match=...)``): those failures are the test's subject, not a surprise, and
the gate counts only the others. ``assert not ndbg.explain_failure()`` inside ``pytest.raises`` is not seen
this way (nothing tells the plugin it raised); use a helper there, or the marker. Likewise the kinds a test
accepted with ``assert_healthy(ignore=[...])`` (the fine-tuning pattern: frozen layers on purpose) are accepted by
the gate.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from . import records, reporting, verdict
from .errors import PluginError
from .records import HypothesisRecord, RunRecord
from .state import FIXTURE_KEY, SessionState


class GateFailure(PluginError, AssertionError):
    """A test failed by the gate; its report shows this text alone (see :func:`show`)."""


def gate_text(
    recs: Sequence[RunRecord], source: str = "--neuraldbg-gate", explained: str = "", several: bool = False
) -> str:
    """The failure text of a test failed by the gate: verdict line first, then the explanations.

    ``explained``: the text of the test's other failure; explanations it already gives are not repeated.
    ``several``: the test watched several runs, so each failure is named with its run.
    """
    bad: list[HypothesisRecord] = []
    for rec in recs:
        for h in rec["hypotheses"]:
            if several:
                h = h.copy()
                h["summary"] = f"run {rec['run']}: {h['summary']}"
            bad.append(h)
    first = verdict.headline(bad, "NeuralDBG gate: training is unhealthy")
    hint = (
        f"Failed by the NeuralDBG gate (gate=fail from {source}). For a test that trains a broken model on "
        "purpose, assert on the failure it expects (with pytest.raises(AssertionError): "
        'assert_no_dead_neurons(ndbg)) or use @pytest.mark.neuraldbg(gate="off").'
    )
    carried = bool(explained) and all(h["explanation"] in explained for h in bad)
    return verdict.failure_text(first, [] if carried else bad, [hint])


def combined(first: str, second: str) -> str:
    """One failure text from two: both verdict lines first, then the rest of each, in the same order."""
    (head1, _, rest1), (head2, _, rest2) = first.partition("\n"), second.partition("\n")
    return "\n".join([head1, head2]) + (f"\n{rest1}" if rest1 else "") + (f"\n{rest2}" if rest2 else "")


def unexpected(recs: Sequence[RunRecord]) -> list[RunRecord]:
    """The unhealthy runs, each with only the failures no assertion helper of the (passing) test raised on and
    whose kind the test did not ignore (``assert_healthy(ignore=...)``)."""
    out = []
    for rec in recs:
        if rec["verdict"] != records.UNHEALTHY:
            continue
        left = [h for h in rec["hypotheses"] if not h.get("asserted") and not h.get("ignored")]
        if left:
            kept = rec.copy()
            kept["hypotheses"] = left
            out.append(kept)
    return out


def check(item: pytest.Item, state: SessionState, other: str = "") -> None:
    """Raise :class:`GateFailure` when the test's gate is ``fail`` and a run it watched has a failure the test
    did not assert on itself.

    ``other``: the text of the test's other failure (its baseline check's), reported after the gate's.
    """
    __tracebackhide__ = True
    fixture = item.stash.get(FIXTURE_KEY, None)
    if fixture is None or fixture.settings.gate != "fail":
        return
    recs = reporting.record_item(item, state)
    unhealthy = unexpected(recs)
    if unhealthy:
        text = gate_text(unhealthy, fixture.settings.source("gate"), other, several=len(recs) > 1)
        raise GateFailure(combined(text, other) if other else text)


def finish(item: pytest.Item, state: SessionState) -> None:
    """After a test body that returned: the baseline check, then the gate; raises the test's failure, if any."""
    __tracebackhide__ = True
    try:
        reporting.finish_baseline(item, passed=True)
    except pytest.fail.Exception as exc:  # a baseline regression, or a missing or invalid file
        check(item, state, other=str(exc))
        raise
    check(item, state)


def show(report: pytest.TestReport, call: pytest.CallInfo[None]) -> None:
    """A test failed by the gate reports the gate's text alone, with no traceback and no exception name.

    So the terminal's short summary and pytest's JUnit ``message`` start with its verdict line.
    """
    if report.failed and call.excinfo is not None and isinstance(call.excinfo.value, GateFailure):
        report.longrepr = str(call.excinfo.value)
