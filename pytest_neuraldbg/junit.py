"""The training-health JUnit file of ``--neuraldbg-junit=PATH``, written with the ``junit-xml`` package.

One test suite ``neuraldbg``; per watched run one test case per check (vanishing gradients, exploding
gradients, dead neurons, saturation, non-finite values, frozen parameters, stalled updates), named after the
failure kind, with the test's node id as class name. A failing case carries the one-line verdict as its
message and the explanation, causal chain and Mermaid graph as its text: junit-xml flattens multi-line
property values, and no JUnit viewer renders Mermaid anyway.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from . import records, verdict


def _junit_xml() -> Any:
    return importlib.import_module("junit_xml")  # untyped package: used through Any


def _case(record: dict[str, Any], label: str, kind: str) -> Any:
    case = _junit_xml().TestCase(kind, classname=label, file=str(record["nodeid"]).split("::", 1)[0])
    if record["verdict"] == records.ERROR:
        case.add_error_info(message=str(record.get("error", "error")), error_type="NeuralDbgError")
        return case
    found = [h for h in record["hypotheses"] if verdict.involves(h, (kind,))]
    if found:
        first_line = verdict.kind_headline(found, (kind,), verdict.CHECKS[kind])
        text = verdict.failure_text(first_line, found, [f"Causal graph (Mermaid):\n{record['mermaid']}"])
        case.add_failure_info(message=first_line, output=text, failure_type="TrainingHealth")
    return case


def report(recs: Sequence[dict[str, Any]]) -> str:
    """The XML document: every run checked for every failure kind."""
    junit_xml = _junit_xml()
    per_test: dict[str, int] = {}
    for r in recs:
        per_test[r["nodeid"]] = per_test.get(r["nodeid"], 0) + 1
    cases = [_case(r, records.run_label(r, per_test[r["nodeid"]]), kind) for r in recs for kind in verdict.CHECKS]
    unhealthy = sum(r["verdict"] == records.UNHEALTHY for r in recs)
    properties = {"neuraldbg.runs": str(len(recs)), "neuraldbg.unhealthy_runs": str(unhealthy)}
    suite = junit_xml.TestSuite("neuraldbg", cases, properties=properties)
    return str(junit_xml.to_xml_report_string([suite], encoding="utf-8"))
