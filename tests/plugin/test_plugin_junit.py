"""The health JUnit file from hand-made run records: the run-level "observed" case, outcomes, baselines.

Plugin-side: the records carry hypotheses of the run-level kinds the engine will emit (its detectors for them
land separately); what is tested is where the plugin puts them.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from pytest_neuraldbg import junit
from pytest_neuraldbg.outcomes import BaselineResult, Outcomes


def hypothesis(kind: str, layer: str = "", **extra: Any) -> dict[str, Any]:
    where = f"'{layer}'" if layer else "the model"
    summary = f"{kind} at {where} from step 0 (confidence 1.00)"
    chain = [{"kind": kind, "text": f"run initial -> {kind} at {where}", "where": where, "step_start": 0}]
    return {"kind": kind, "summary": summary, "explanation": f"Because {kind}.", "layer": layer, "step": 0,
            "chain": chain, **extra}  # fmt: skip


def record(nodeid: str, *hypotheses: dict[str, Any]) -> dict[str, Any]:
    verdict = "unhealthy" if hypotheses else "healthy"
    return {"nodeid": nodeid, "run": "1", "verdict": verdict, "hypotheses": list(hypotheses), "mermaid": "flowchart TD"}


def cases(xml: str) -> dict[str, ET.Element]:
    return {f"{c.get('classname')}::{c.get('name')}": c for c in ET.fromstring(xml).iter("testcase")}


def outcomes(**tests: str) -> Outcomes:
    found = Outcomes()
    found.tests.update({f"t.py::{name}": outcome for name, outcome in tests.items()})
    return found


def test_a_run_level_failure_fails_the_observed_case_and_no_layer_check() -> None:
    found = cases(junit.report([record("t.py::test_x", hypothesis("no_gradient"))]))
    assert [name for name, case in found.items() if case.find("failure") is not None] == ["t.py::test_x::observed"]
    failure = found["t.py::test_x::observed"].find("failure")
    assert failure is not None
    assert (
        failure.get("message")
        == "NeuralDBG: run-level failure - no_gradient at the model from step 0 (confidence 1.00)"
    )
    assert len(found) >= 8  # every layer-level check and "observed" (main added kinds since)


def test_failures_of_an_xfailed_test_or_asserted_by_a_passing_test_are_skipped_with_the_reason() -> None:
    recs = [
        record("t.py::test_xfail", hypothesis("dead_neurons", "3")),
        record("t.py::test_caught", hypothesis("dead_neurons", "3", asserted=True)),
        record("t.py::test_gate", hypothesis("dead_neurons", "3", asserted=True)),  # asserted, yet the test failed
    ]
    found = cases(junit.report(recs, outcomes=outcomes(test_xfail="xfailed", test_caught="passed", test_gate="failed")))
    xfail = found["t.py::test_xfail::dead_neurons"].find("skipped")
    caught = found["t.py::test_caught::dead_neurons"].find("skipped")
    assert xfail is not None and xfail.get("message", "").startswith("expected failure (xfail): NeuralDBG: dead")
    assert caught is not None and caught.get("message", "").startswith("expected by the test: NeuralDBG: dead")
    assert found["t.py::test_gate::dead_neurons"].find("failure") is not None
    statuses = {n.rsplit("::", 1)[1]: c.get("status") for n, c in found.items() if "test_xfail" in n}
    assert statuses.pop("dead_neurons") == "skipped"  # each case's status is its own result
    assert set(statuses.values()) == {"passed"}


def test_each_tests_baseline_is_a_case_that_fails_on_what_fails_the_test() -> None:
    text = "NeuralDBG baseline regression: grad_norm at '0' 101x smaller\n\ntable"
    baselines = {
        "t.py::test_regressed": BaselineResult("regressed", ["grad_norm at '0' 101x smaller"], "p", text),
        "t.py::test_matched": BaselineResult("matched", [], "q"),
        "t.py::test_idle": BaselineResult("no run", ["NeuralDBG baseline: t.py::test_idle ... watched no run"], "r"),
        "t.py::test_unwritten": BaselineResult("not written", [], "s"),
    }
    found = cases(junit.report([], baselines=baselines))
    regressed = found["t.py::test_regressed::baseline"].find("failure")
    assert regressed is not None and regressed.get("message") == text.split("\n")[0] and regressed.text == text
    idle = found["t.py::test_idle::baseline"].find("failure")
    assert idle is not None and "watched no run" in (idle.text or "")
    assert len(found["t.py::test_matched::baseline"]) == 0  # passed: no child element
    assert found["t.py::test_unwritten::baseline"].find("skipped") is not None
    suite = ET.fromstring(junit.report([], baselines=baselines)).find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["neuraldbg.failed_baselines"] == "2"
