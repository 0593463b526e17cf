"""pytest's own ``--junitxml``: each watched run's verdict, root, onset and explanation as short properties; the
chain and the Mermaid graph of an unhealthy run in its failing case's ``<system-out>``."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from integration_support import SILENT_TESTS, junit_cases, properties, render_mermaid

TWO_RUNS = """
import models

def test_two(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=20, name="good")
    neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=20, name="bad")
"""


@pytest.fixture
def cases(project: pytest.Pytester) -> dict[str, ET.Element]:
    project.makepyfile(test_silent=SILENT_TESTS, test_two=TWO_RUNS)
    result = project.runpytest("--junitxml=junit.xml", "--neuraldbg-gate", "-o", "junit_logging=system-out")
    result.assert_outcomes(passed=1, failed=2)
    assert "record_property" not in result.stdout.str()  # no xunit2 warning: properties go in directly
    return junit_cases(project.path / "junit.xml")


def test_an_unhealthy_run_has_short_properties_and_its_graph_in_the_output(cases: dict[str, ET.Element]) -> None:
    case = cases["test_silent::test_dead"]
    props = dict(properties(case))
    assert list(props) == ["neuraldbg.verdict", "neuraldbg.root", "neuraldbg.onset", "neuraldbg.explanation"]
    assert (props["neuraldbg.verdict"], props["neuraldbg.root"], props["neuraldbg.onset"]) == (
        "unhealthy",
        "dead_neurons at '3'",
        "step 0",
    )
    assert props["neuraldbg.explanation"].startswith("Dead neurons in '3' (ReLU), fed by '2' (Linear)")
    assert all("\n" not in value and len(value) <= 300 for value in props.values())  # lines a person reads
    output = case.find("system-out")
    assert output is not None and output.text is not None
    graph = output.text.split("Causal graph (Mermaid):\n", 1)[1].split("\n\n")[0]
    assert graph.startswith("flowchart TD\n")
    render_mermaid(graph)


def test_the_chain_is_in_the_output_with_layers_relations_and_steps(cases: dict[str, ET.Element]) -> None:
    output = cases["test_silent::test_dead"].find("system-out")
    assert output is not None and output.text is not None
    chain = output.text.split("Causal chain (root first):\n", 1)[1].split("Causal graph")[0].splitlines()
    assert chain[0].startswith("  root '3': 100% of 16 units dead (never positive), steps 0-")
    assert {line.split("(", 1)[-1] for line in chain[1:]} >= {
        "'3' zeroes the gradient of '0')",
        "'3' zeroes the gradient of '2')",
    }


def test_a_healthy_run_says_so(cases: dict[str, ET.Element]) -> None:
    case = cases["test_silent::test_healthy"]
    assert properties(case) == [("neuraldbg.verdict", "healthy")]  # no graph, no chain for a healthy run
    output = case.find("system-out")  # pytest's own, empty: no graph, no chain
    assert case.find("failure") is None and "flowchart" not in (output.text or "" if output is not None else "")


def test_the_failure_text_carries_the_explanation_behind_a_one_line_verdict(cases: dict[str, ET.Element]) -> None:
    failure = cases["test_silent::test_dead"].find("failure")
    assert failure is not None
    assert failure.get("message", "").splitlines()[0] == (
        "NeuralDBG gate: training is unhealthy - dead_neurons at '3' from step 0 (confidence 1.00)"
    )
    assert "Dead neurons in '3' (ReLU)" in (failure.text or "")


def test_a_test_with_several_runs_gets_one_group_of_properties_per_run(cases: dict[str, ET.Element]) -> None:
    props = properties(cases["test_two::test_two"])
    assert [name for name, _ in props] == [
        *("neuraldbg.run", "neuraldbg.verdict"),
        *("neuraldbg.run", "neuraldbg.verdict", "neuraldbg.root", "neuraldbg.onset", "neuraldbg.explanation"),
    ]
    assert [value for name, value in props if name in ("neuraldbg.run", "neuraldbg.verdict")] == [
        "good",
        "healthy",
        "bad",
        "unhealthy",
    ]


BARE_IDIOM = """
import models

def test_bare(neuraldbg):
    ndbg = models.loop(neuraldbg, models.dead())
    assert not ndbg.explain_failure()
"""


@pytest.mark.parametrize("xdist", [False, True], ids=["one-process", "two-workers"])
def test_the_bare_idiom_fails_with_the_explanation_and_the_chain_in_its_failure_text(
    project: pytest.Pytester, xdist: bool
) -> None:
    project.makepyfile(test_bare=BARE_IDIOM)
    if xdist:
        pytest.importorskip("xdist")
        result = project.runpytest_subprocess("--junitxml=junit.xml", "-n", "2", "-p", "no:cacheprovider")
    else:
        result = project.runpytest("--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    case = junit_cases(project.path / "junit.xml")["test_bare::test_bare"]
    failure = case.find("failure")
    assert failure is not None
    assert failure.get("message", "").startswith(
        "AssertionError: assert not <unhealthy training: dead_neurons at '3' from step 0 (confidence 1.00)>"
    )
    text = failure.text or ""
    assert "Dead neurons in '3' (ReLU), fed by '2' (Linear)" in text
    assert "Causal chain (root first):\n  root '3': 100% of 16 units dead (never positive), steps 0-" in text
    assert dict(properties(case))["neuraldbg.verdict"] == "unhealthy"  # the properties stay
    # the terminal shows it once, as the last part of the failure
    assert result.stdout.str().count("Dead neurons in '3' (ReLU)") == 1
    result.stdout.fnmatch_lines(
        ["E       AssertionError: assert not <unhealthy training: *", "*- NeuralDBG training health -*"]
    )
