"""Run-level failures (no training observed, no gradient, eval mode, degenerate loss, incomplete observation) are
failures like any other: assert_healthy, the gate and the reports fail on them; the health JUnit file puts them
in the run's "observed" case.

Plugin-side tests: the engine's own detectors for these kinds land separately, so the hypothesis here comes
from a detector registered through the engine's public plugin API (``plugins=[...]``), which reports every
step of the run as one of these kinds. What is tested is how the plugin treats such a hypothesis.
"""

from __future__ import annotations

import pytest
from integration_support import junit_cases

RUN_LEVEL = """
import models
import pytest
from neuraldbg import FailureKind, hookimpl
from neuraldbg.detectors import Detector, Finding, Observation
from neuraldbg.events import EventType
from pytest_neuraldbg import assert_healthy, assert_no_dead_neurons


class StandIn(Detector):
    \"\"\"Reports the whole run as {kind} (a stand-in for the engine's run-level detectors).\"\"\"

    name = "stand_in_{kind}"
    event_type = EventType.RUN

    def observe(self, view):
        obs = Observation()
        obs.saw(self.event_type, "")
        obs.findings.append(Finding(self.event_type, FailureKind("{kind}"), "", "{kind}", {{"steps": 1.0}}, 1.0))
        return obs


class Plugin:
    @hookimpl
    def neuraldbg_detectors(self, config):
        return [StandIn()]


def run(neuraldbg):
    return neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=10, plugins=[Plugin()])


def test_silent(neuraldbg):
    run(neuraldbg)


def test_assert_healthy(neuraldbg):
    assert_healthy(run(neuraldbg))


def test_ignored_on_purpose(neuraldbg):
    ndbg = run(neuraldbg)
    assert_healthy(ndbg, ignore=["{kind}"])
    assert_no_dead_neurons(ndbg)  # a layer-level check: not its business
"""

KINDS = ["no_training_observed", "no_gradient", "eval_mode_training", "degenerate_loss", "incomplete_observation"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_level_failure_fails_assert_healthy_the_gate_and_the_observed_case(
    project: pytest.Pytester, kind: str
) -> None:
    project.makepyfile(test_run=RUN_LEVEL.format(kind=kind))
    result = project.runpytest("--neuraldbg-gate", "--neuraldbg-junit=health.xml", "--neuraldbg-report=report")
    result.assert_outcomes(passed=1, failed=2)  # what a test ignored for assert_healthy, the gate ignores too
    result.stdout.fnmatch_lines([f"E       AssertionError: NeuralDBG: training is unhealthy - {kind} from step 0*"])
    result.stdout.fnmatch_lines([f"NeuralDBG gate: training is unhealthy - {kind} from step 0*"])
    cases = junit_cases(project.path / "health.xml")
    failing = {name.split("::")[-1] for name, case in cases.items() if case.find("failure") is not None}
    assert failing == {"observed"}  # no layer-level check claims it
    failure = cases["test_run.py::test_silent::observed"].find("failure")
    assert failure is not None
    assert failure.get("message", "").startswith(f"NeuralDBG: run-level failure - {kind} from step 0")
    summary = (project.path / "report" / "summary.md").read_text("utf-8")
    escaped = kind.replace("_", chr(92) + "_")
    cells = f"❌ unhealthy | {escaped} | the model | 0 | - |"
    assert f"| `test_run.py::test_silent` | **failed** | {cells}" in summary
    assert f"| `test_run.py::test_ignored_on_purpose` | passed | {cells}" in summary


def test_without_the_gate_only_the_helper_fails_and_ignore_accepts_the_kind(project: pytest.Pytester) -> None:
    project.makepyfile(test_run=RUN_LEVEL.format(kind="no_gradient"))
    result = project.runpytest()
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_run.py::test_assert_healthy - AssertionError: NeuralDBG*"])
