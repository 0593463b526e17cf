"""``--neuraldbg-junit=PATH``: a training-health JUnit file, one test case per watched run and check."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from integration_support import SILENT_TESTS, junit_cases, render_mermaid

from neuraldbg.kinds import BUILTIN

#: One case per layer-level failure kind of the engine, and "observed" for the run-level kinds.
CHECKS = {room.name for room in BUILTIN if not room.run_level} | {"observed"}


@pytest.fixture
def health_xml(project: pytest.Pytester) -> Path:
    project.makepyfile(test_silent=SILENT_TESTS)
    result = project.runpytest("--neuraldbg-junit=out/health.xml")
    result.assert_outcomes(passed=2)  # the JUnit file judges training; the tests themselves pass
    result.stdout.fnmatch_lines(["neuraldbg: wrote */out/health.xml"])
    return project.path / "out" / "health.xml"


def test_every_run_is_checked_for_every_failure_kind(health_xml: Path) -> None:
    cases = junit_cases(health_xml)
    tests = ("test_dead", "test_healthy")
    assert set(cases) == {f"test_silent.py::{test}::{check}" for test in tests for check in CHECKS}
    assert len(CHECKS) == 9  # eight layer-level checks (oversized updates among them) and the run-level one
    suite = ET.parse(health_xml).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("name"), suite.get("tests"), suite.get("failures")) == ("neuraldbg", "18", "1")  # one fault
    statuses = {name: case.get("status") for name, case in cases.items()}  # each case's own result
    assert statuses.pop("test_silent.py::test_dead::dead_neurons") == "failed"
    assert set(statuses.values()) == {"passed"}


def test_the_dead_run_fails_once_under_its_root_kind_with_the_vanishing_gradients_it_causes_in_its_text(
    health_xml: Path,
) -> None:
    cases = junit_cases(health_xml)
    failed = {name for name, case in cases.items() if case.find("failure") is not None}
    assert failed == {"test_silent.py::test_dead::dead_neurons"}  # one failing case per fault: the root's kind
    failure = cases["test_silent.py::test_dead::dead_neurons"].find("failure")
    assert failure is not None
    assert "-> '0': gradient exactly zero" in (failure.text or "")  # what it caused is in its text
    assert "('3' zeroes the gradient of '2')" in (failure.text or "")


def test_a_failing_case_carries_the_explanation_and_a_mermaid_graph_that_renders(health_xml: Path) -> None:
    failure = junit_cases(health_xml)["test_silent.py::test_dead::dead_neurons"].find("failure")
    assert failure is not None and failure.text is not None
    first, rest = failure.text.split("\n", 1)
    assert first.startswith("NeuralDBG: dead neurons - dead_neurons at '3' from step 0")
    assert "Dead neurons in '3' (ReLU), fed by '2' (Linear)" in rest
    assert "root '3': 100% of" in rest and "units dead (never positive)" in rest
    output = junit_cases(health_xml)["test_silent.py::test_dead::dead_neurons"].find("system-out")
    assert output is not None and output.text is not None  # the graph: where viewers show multi-line text
    graph = output.text.split("NeuralDBG causal graph (Mermaid):\n", 1)[1]
    assert graph.startswith("flowchart TD")
    render_mermaid(graph)
    properties = ET.parse(health_xml).getroot().iter("property")
    assert all("\n" not in (p.get("value") or "") and "flowchart" not in (p.get("value") or "") for p in properties)
