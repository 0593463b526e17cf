"""The health JUnit counts faults, not symptoms: one failing case per fault, statuses that mean the case, unobserved
checks skipped with the reason, and what the test ignored or turned off not failed."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from pytest_neuraldbg import junit, reporting
from pytest_neuraldbg.outcomes import Outcomes


def hypothesis(kind: str, layer: str = "", effects: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    where = f"'{layer}'" if layer else "the model"
    chain = [{"kind": kind, "text": f"{kind} at {where}", "where": where, "step_start": 0}]
    chain += [{"kind": effect, "text": f"{effect} upstream", "where": "'0'", "step_start": 0} for effect in effects]
    return {"kind": kind, "summary": f"{kind} at {where} from step 0 (confidence 1.00)", "explanation": f"{kind}.",
            "layer": layer, "step": 0, "chain": chain, **extra}  # fmt: skip


def record(nodeid: str, *hypotheses: dict[str, Any], **extra: Any) -> dict[str, Any]:
    verdict = "unhealthy" if hypotheses else "healthy"
    return {"nodeid": nodeid, "run": "1", "verdict": verdict, "hypotheses": list(hypotheses),
            "mermaid": "flowchart TD", **extra}  # fmt: skip


def cases(xml: str) -> dict[str, ET.Element]:
    return {f"{c.get('classname')}::{c.get('name')}": c for c in ET.fromstring(xml).iter("testcase")}


def outcomes(**tests: str) -> Outcomes:
    found = Outcomes()
    found.tests.update({f"t.py::{name}": outcome for name, outcome in tests.items()})
    return found


def test_a_dead_relu_is_one_failing_case_not_also_a_vanishing_gradient_failure() -> None:
    dead = hypothesis("dead_neurons", "3", effects=("vanishing_gradients", "vanishing_gradients"))
    found = cases(junit.report([record("t.py::test_dead", dead)], outcomes=outcomes(test_dead="failed")))
    failing = [name for name, case in found.items() if case.find("failure") is not None]
    assert failing == ["t.py::test_dead::dead_neurons"]
    assert found["t.py::test_dead::vanishing_gradients"].get("status") == "passed"
    assert found["t.py::test_dead::dead_neurons"].get("status") == "failed"  # not the test's outcome


def test_eight_faults_are_eight_failures() -> None:
    kinds = ["dead_neurons", "exploding_gradients", "saturated_activations", "non_finite", "frozen_parameters"]
    recs = [record(f"t.py::test_{i}", hypothesis(kind, "1", effects=("vanishing_gradients",))) for i, kind in
            enumerate(kinds * 2)][:8]  # fmt: skip
    root = ET.fromstring(junit.report(recs))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("failures") == "8"


def test_green_cases_of_a_failed_test_read_passed() -> None:
    found = cases(junit.report([record("t.py::test_x")], outcomes=outcomes(test_x="failed")))
    assert {case.get("status") for case in found.values()} == {"passed"}


def test_a_run_without_a_backward_pass_skips_its_layer_checks_with_the_reason() -> None:
    found = cases(junit.report([record("t.py::test_x", hypothesis("no_gradient"))]))
    layer_cases = {name: case for name, case in found.items() if not name.endswith("::observed")}
    assert len(layer_cases) >= 7  # every layer-level kind (main added kinds since)
    for case in layer_cases.values():
        skipped = case.find("skipped")
        assert skipped is not None and case.get("status") == "skipped"
        assert skipped.get("message", "").startswith("not observed: NeuralDBG: run-level failure - no_gradient")
    assert found["t.py::test_x::observed"].find("failure") is not None


def test_kinds_the_test_ignored_and_tests_with_the_gate_off_are_skipped_not_failed() -> None:
    recs = [
        record("t.py::test_finetune", hypothesis("frozen_parameters", "0", ignored=True)),
        record("t.py::test_off", hypothesis("dead_neurons", "3"), gate="off"),
        record("t.py::test_both", hypothesis("frozen_parameters", "0", ignored=True), hypothesis("dead_neurons", "3")),
    ]
    found = cases(junit.report(recs, outcomes=outcomes(test_finetune="passed", test_off="passed", test_both="failed")))
    ignored = found["t.py::test_finetune::frozen_parameters"].find("skipped")
    assert ignored is not None and ignored.get("message", "").startswith("ignored by the test (assert_healthy(ignore")
    off = found["t.py::test_off::dead_neurons"].find("skipped")
    assert off is not None and off.get("message", "").startswith('not gated: the test turned the gate off (gate="off")')
    assert found["t.py::test_both::dead_neurons"].find("failure") is not None
    assert found["t.py::test_both::frozen_parameters"].find("skipped") is not None


def test_a_failing_case_has_its_graph_in_system_out_and_properties_stay_short() -> None:
    rec = record("t.py::test_dead", hypothesis("dead_neurons", "3", explanation="x" * 2000))
    found = cases(junit.report([rec], attachments={id(rec): ["report/t.gradient-flow.png"]}))
    output = found["t.py::test_dead::dead_neurons"].find("system-out")
    assert output is not None and output.text is not None
    assert output.text.startswith("[[ATTACHMENT|report/t.gradient-flow.png]]\nNeuralDBG causal graph (Mermaid):")
    props = reporting.user_properties(rec)  # type: ignore[arg-type]
    assert [name for name, _ in props] == ["neuraldbg.verdict", "neuraldbg.root", "neuraldbg.onset",
                                           "neuraldbg.explanation"]  # fmt: skip
    assert all(len(value) <= 300 and "\n" not in value for _, value in props)
    assert reporting.user_properties(record("t.py::test_ok")) == [("neuraldbg.verdict", "healthy")]  # type: ignore[arg-type]
