"""Test outcomes counted the way pytest's terminal counts them, from hand-made reports."""

from __future__ import annotations

from types import SimpleNamespace

from pytest_neuraldbg.outcomes import BaselineResult, Outcomes, baseline_results, category


def report(nodeid: str, when: str, outcome: str, xfail: bool = False) -> SimpleNamespace:
    rep = SimpleNamespace(nodeid=nodeid, when=when, outcome=outcome, **({"wasxfail": ""} if xfail else {}))
    rep.passed, rep.failed, rep.skipped = (outcome == o for o in ("passed", "failed", "skipped"))
    return rep


def test_each_report_counts_as_pytest_counts_it() -> None:
    assert category(report("t", "setup", "passed")) is None
    assert category(report("t", "call", "passed")) == "passed"
    assert category(report("t", "call", "passed", xfail=True)) == "xpassed"
    assert category(report("t", "call", "failed")) == "failed"
    assert category(report("t", "call", "skipped", xfail=True)) == "xfailed"
    assert category(report("t", "setup", "skipped")) == "skipped"
    assert category(report("t", "setup", "failed")) == "error"
    assert category(report("t", "teardown", "failed")) == "error"
    assert category(report("t", "call", "rerun")) is None


def test_a_test_that_passed_and_failed_its_teardown_counts_twice_and_reads_error() -> None:
    seen = Outcomes()
    for rep in (
        report("t::a", "setup", "passed"),
        report("t::a", "call", "passed"),
        report("t::a", "teardown", "failed"),
        report("t::b", "call", "failed"),
        report("t::c", "call", "skipped", xfail=True),
        report("t::d", "setup", "failed"),
        report("t::e", "setup", "failed"),
    ):
        seen.add(rep)
    assert seen.text() == "1 failed, 1 passed, 1 xfailed, 3 errors"  # pytest's words, in pytest's order
    assert [seen.of(t) for t in ("t::a", "t::b", "t::c", "t::d", "t::x")] == ["error", "failed", "xfailed", "error", ""]


def test_a_tests_baseline_result_is_its_most_urgent_note() -> None:
    notes = [
        {"nodeid": "t::a", "path": "p", "status": "matched", "lines": []},
        {"nodeid": "t::a", "path": "p", "status": "regressed", "lines": ["worse"], "text": "NeuralDBG baseline ..."},
        {"nodeid": "t::b", "path": "q", "status": "created", "lines": []},
    ]
    results = baseline_results(notes)
    assert results["t::a"] == BaselineResult("regressed", ["worse"], "p", "NeuralDBG baseline ...")
    assert results["t::a"].failed and not results["t::b"].failed
