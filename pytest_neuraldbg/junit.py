"""The training-health JUnit file of ``--neuraldbg-junit=PATH``, written with the ``junit-xml`` package.

One test suite ``neuraldbg``. Per watched run, one test case per layer-level check (vanishing gradients,
exploding gradients, dead neurons, saturated activations, non-finite values, frozen parameters, stalled
updates), named after the failure kind, and one case ``observed`` that fails on any run-level failure (no
training step observed, no gradient, training in eval mode, a degenerate loss, an incomplete observation):
such a run says nothing about its layers, so it cannot pass as observed. Per test with a baseline, one case
``baseline`` that fails on a regression, a missing or invalid file, or a test that watched no run. The class
name is the test's node id (with the run's name when it watched several).

Cases agree with the test outcomes: every case carries its test's outcome as ``status``; the failing checks of
a test that is an expected failure (``xfail``) are ``skipped`` with "expected failure (xfail)", as pytest's
own JUnit writes that test, and so are those whose every failure an assertion helper of the passing test
raised on and the test caught ("expected by the test"). A failing case carries the one-line verdict as its
message and the explanation, causal chain and Mermaid graph as its text: junit-xml flattens multi-line
property values, and no JUnit viewer renders Mermaid anyway.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from . import records, verdict
from .outcomes import BaselineResult, Outcomes
from .records import RunRecord

OBSERVED = "observed"  # the case of the run-level kinds
BASELINE = "baseline"  # the case of a test's baseline


def _junit_xml() -> Any:
    return importlib.import_module("junit_xml")  # untyped package: used through Any


def checks(record: Mapping[str, Any]) -> list[tuple[str, tuple[str, ...], str]]:
    """Each case of a run: its name, the failure kinds it fails on, and how its verdict line names them. One case
    per layer-level kind the run was checked for (the built-in ones and its plugins'), one case ``observed`` for the
    run-level kinds."""
    names = list(record.get("kinds") or verdict.kinds())
    names += [h["kind"] for h in record["hypotheses"] if h["kind"] not in names]
    layer = [(kind, (kind,), verdict.title(kind)) for kind in names if not verdict.run_level(kind)]
    run = tuple(kind for kind in names if verdict.run_level(kind))
    return [*layer, (OBSERVED, run, "run-level failure")]


def _judge(case: Any, outcome: str, first_line: str, text: str, expected_by_test: bool) -> None:
    """A failure, or a skip that says why the failure was expected (and by whom)."""
    if outcome == "xfailed":
        case.add_skipped_info(message=f"expected failure (xfail): {first_line}", output=text)
    elif outcome == "passed" and expected_by_test:
        case.add_skipped_info(message=f"expected by the test: {first_line}", output=text)
    else:
        case.add_failure_info(message=first_line, output=text, failure_type="TrainingHealth")


def _case(record: RunRecord, label: str, check: tuple[str, tuple[str, ...], str], outcome: str) -> Any:
    name, kinds, what = check
    case = _junit_xml().TestCase(
        name, classname=label, file=str(record["nodeid"]).split("::", 1)[0], status=outcome or None
    )
    if record["verdict"] == records.ERROR:
        case.add_error_info(message=str(record.get("error", "error")), error_type="NeuralDbgError")
        return case
    found = [h for h in record["hypotheses"] if verdict.involves(h, kinds)]
    if found:
        first_line = verdict.kind_headline(found, kinds, what)
        text = verdict.failure_text(first_line, found, [f"Causal graph (Mermaid):\n{record['mermaid']}"])
        _judge(case, outcome, first_line, text, all(h.get("asserted") for h in found))
    return case


def _baseline_case(nodeid: str, result: BaselineResult, outcome: str) -> Any:
    case = _junit_xml().TestCase(BASELINE, classname=nodeid, file=nodeid.split("::", 1)[0], status=outcome or None)
    if result.failed:
        text = result.text or "\n".join([f"NeuralDBG baseline {result.status}: {result.path}", *result.lines])
        _judge(case, outcome, text.split("\n", 1)[0], text, False)
    elif result.status == "not written":
        case.add_skipped_info(message=f"baseline not written: the test did not pass ({result.path})")
    return case


def report(
    recs: Sequence[RunRecord],
    *,
    outcomes: Outcomes | None = None,
    baselines: Mapping[str, BaselineResult] | None = None,
) -> str:
    """The XML document: every run checked for every failure kind, and every test's baseline."""
    junit_xml = _junit_xml()
    outcome_of = outcomes.of if outcomes is not None else (lambda _: "")
    baselines = dict(baselines or {})
    per_test: dict[str, int] = {}
    for r in recs:
        per_test[r["nodeid"]] = per_test.get(r["nodeid"], 0) + 1
    cases = [
        _case(r, records.run_label(r, per_test[r["nodeid"]]), check, outcome_of(str(r["nodeid"])))
        for r in recs
        for check in checks(r)
    ]
    cases += [_baseline_case(nodeid, baselines[nodeid], outcome_of(nodeid)) for nodeid in sorted(baselines)]
    unhealthy = sum(r["verdict"] == records.UNHEALTHY for r in recs)
    properties = {
        "neuraldbg.runs": str(len(recs)),
        "neuraldbg.unhealthy_runs": str(unhealthy),
        "neuraldbg.failed_baselines": str(sum(result.failed for result in baselines.values())),
    }
    suite = junit_xml.TestSuite("neuraldbg", cases, properties=properties)
    return str(junit_xml.to_xml_report_string([suite], encoding="utf-8"))
