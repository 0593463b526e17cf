"""pytest's own ``--junitxml``: each watched run's verdict, explanation, chain and Mermaid graph as properties."""

from __future__ import annotations

import json
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
    result = project.runpytest("--junitxml=junit.xml", "--neuraldbg-gate")
    result.assert_outcomes(passed=1, failed=2)
    assert "record_property" not in result.stdout.str()  # no xunit2 warning: properties go in directly
    return junit_cases(project.path / "junit.xml")


def test_an_unhealthy_run_has_its_verdict_explanation_and_mermaid_as_properties(cases: dict[str, ET.Element]) -> None:
    props = dict(properties(cases["test_silent::test_dead"]))
    assert list(props) == ["neuraldbg.verdict", "neuraldbg.explanation", "neuraldbg.chain", "neuraldbg.mermaid"]
    assert props["neuraldbg.verdict"] == "unhealthy"
    assert props["neuraldbg.explanation"].startswith("Dead neurons in '3' (ReLU), fed by '2' (Linear)")
    assert props["neuraldbg.mermaid"].startswith("flowchart TD\n")  # multi-line values read back exactly
    render_mermaid(props["neuraldbg.mermaid"])


def test_the_chain_property_is_json_with_layers_and_steps(cases: dict[str, ET.Element]) -> None:
    chain = json.loads(dict(properties(cases["test_silent::test_dead"]))["neuraldbg.chain"])
    assert [h["kind"] for h in chain] == ["dead_neurons"]
    root, *effects = chain[0]["chain"]
    assert (root["kind"], root["layer"], root["step_start"], root["metrics"]["dead_fraction"]) == (
        "dead_neurons",
        "3",
        0,
        1.0,
    )
    assert {(e["layer"], e["kind"], e["relation"]) for e in effects} == {
        ("0", "vanishing_gradients", "zeroes the gradient of"),
        ("2", "vanishing_gradients", "zeroes the gradient of"),
    }


def test_a_healthy_run_says_so(cases: dict[str, ET.Element]) -> None:
    props = dict(properties(cases["test_silent::test_healthy"]))
    assert props["neuraldbg.verdict"] == "healthy"
    assert (props["neuraldbg.explanation"], props["neuraldbg.chain"]) == ("", "[]")
    assert "No training failure detected" in props["neuraldbg.mermaid"]
    assert cases["test_silent::test_healthy"].find("failure") is None


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
        *("neuraldbg.run", "neuraldbg.verdict", "neuraldbg.explanation", "neuraldbg.chain", "neuraldbg.mermaid"),
    ] * 2
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
