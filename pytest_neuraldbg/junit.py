"""The training-health JUnit file of ``--neuraldbg-junit=PATH``, written with the ``junit-xml`` package.

One test suite ``neuraldbg``. Per watched run, one test case per layer-level kind (vanishing gradients, exploding
gradients, dead neurons, saturated activations, non-finite values, frozen parameters, stalled updates, and the
kinds of plugins), named after the kind, and one case ``observed`` for the run-level kinds (no training step
observed, no gradient, training in eval mode, a degenerate loss, an incomplete observation). Per test with a
baseline, one case ``baseline``. The class name is the test's node id (with the run's name when it watched several).

One failing case per fault: a case fails when a hypothesis of the run has the case's kind as its *root cause*; the
failures it caused (a dead ReLU's vanishing gradients upstream) are part of that case's text, not failures of their
own. A run with a run-level failure observed nothing its layer checks could judge: they are skipped, with the
reason. Every case's ``status`` says what happened to that case (``passed``, ``failed``, ``skipped``, ``error``),
not what happened to its test.

Failures that are not surprises are skipped with the reason: those of an expected failure (``xfail``), those an
assertion helper of the passing test raised on and the test caught ("expected by the test"), the kinds the test
ignored (``assert_healthy(ignore=...)``), and every failure of a test whose gate is off
(``@pytest.mark.neuraldbg(gate="off")``). A failing case carries the one-line verdict as its message and the
explanation and causal chain as its text; its ``system-out`` holds the causal graph (Mermaid) and, where pictures
were drawn, GitLab's ``[[ATTACHMENT|path]]`` lines for them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from . import records, verdict
from .outcomes import BaselineResult, Outcomes
from .records import HypothesisRecord, RunRecord

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


def _judge(case: Any, outcome: str, first_line: str, text: str, why_expected: str) -> None:
    """A failure, or a skip that says why the failure was expected (and by whom); the case's status says which."""
    if outcome == "xfailed":
        case.add_skipped_info(message=f"expected failure (xfail): {first_line}", output=text)
    elif why_expected:
        case.add_skipped_info(message=f"{why_expected}: {first_line}", output=text)
    else:
        case.add_failure_info(message=first_line, output=text, failure_type="TrainingHealth")
    case.status = "skipped" if case.is_skipped() else "failed"


def _expected(record: RunRecord, found: Sequence[HypothesisRecord], outcome: str) -> str:
    """Why the failures of a case are no surprise (a skip's reason), or ``""``."""
    if record.get("gate") == "off":
        return 'not gated: the test turned the gate off (gate="off")'
    if all(h.get("ignored") for h in found):
        return "ignored by the test (assert_healthy(ignore=...))"
    if outcome == "passed" and all(h.get("asserted") or h.get("ignored") for h in found):
        return "expected by the test"
    return ""


def _case(
    record: RunRecord, label: str, check: tuple[str, tuple[str, ...], str], outcome: str, attachments: Sequence[str]
) -> Any:
    name, kinds, what = check
    case = _junit_xml().TestCase(name, classname=label, file=str(record["nodeid"]).split("::", 1)[0])
    case.status = "passed"
    if record["verdict"] == records.ERROR:
        case.add_error_info(message=str(record.get("error", "error")), error_type="NeuralDbgError")
        case.status = "error"
        return case
    found = [h for h in record["hypotheses"] if h["kind"] in kinds]  # this case's faults: their root is its kind
    run_level = [h for h in record["hypotheses"] if verdict.run_level(h["kind"])]
    if not found and run_level and name != OBSERVED:
        case.add_skipped_info(message=f"not observed: {verdict.headline(run_level, 'NeuralDBG: run-level failure')}")
        case.status = "skipped"
        return case
    if found:
        first_line = verdict.kind_headline(found, kinds, what)
        text = verdict.failure_text(first_line, found)
        _judge(case, outcome, first_line, text, _expected(record, found, outcome))
        if case.status == "failed":
            case.stdout = system_out(record, attachments)
    return case


def system_out(record: RunRecord, attachments: Sequence[str] = ()) -> str:
    """What a viewer shows as the failing case's output: the causal graph (Mermaid) and GitLab's attachment lines
    for the run's pictures."""
    lines = [f"[[ATTACHMENT|{path}]]" for path in attachments]
    if record.get("mermaid"):
        lines += ["NeuralDBG causal graph (Mermaid):", str(record["mermaid"])]
    return "\n".join(lines)


def _baseline_case(nodeid: str, result: BaselineResult, outcome: str) -> Any:
    case = _junit_xml().TestCase(BASELINE, classname=nodeid, file=nodeid.split("::", 1)[0], status="passed")
    if result.failed:
        text = result.text or "\n".join([f"NeuralDBG baseline {result.status}: {result.path}", *result.lines])
        _judge(case, outcome, text.split("\n", 1)[0], text, "")
    elif result.status == "not written":
        case.add_skipped_info(message=f"baseline not written: the test did not pass ({result.path})")
        case.status = "skipped"
    return case


def report(
    recs: Sequence[RunRecord],
    *,
    outcomes: Outcomes | None = None,
    baselines: Mapping[str, BaselineResult] | None = None,
    attachments: Mapping[int, Sequence[str]] | None = None,
) -> str:
    """The XML document: every run checked for every failure kind, and every test's baseline. ``attachments``: per
    record (by ``id``), its picture files as the JUnit reader should find them (GitLab: relative to the project)."""
    attachments = attachments or {}
    junit_xml = _junit_xml()
    outcome_of = outcomes.of if outcomes is not None else (lambda _: "")
    baselines = dict(baselines or {})
    per_test: dict[str, int] = {}
    for r in recs:
        per_test[r["nodeid"]] = per_test.get(r["nodeid"], 0) + 1
    cases = [
        _case(
            r,
            records.run_label(r, per_test[r["nodeid"]]),
            check,
            outcome_of(str(r["nodeid"])),
            attachments.get(id(r), ()),
        )
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
