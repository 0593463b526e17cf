"""Training-health baselines: ``baseline=True`` / ``assert_matches_baseline``, ``--neuraldbg-update-baselines``,
the tolerances and their precedence, bad files, stale files, and the same outcomes under ``-n 2``."""

from __future__ import annotations

import json
import math
import platform
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from integration_support import MODELS, junit_cases, properties

import neuraldbg
from pytest_neuraldbg import baseline

#: Two tests comparing a 20-step smoke run with their baselines: one by marker, one by the fixture's method.
#: BASELINE_MODEL picks the model: healthy (default), shrunk (last layer's initial weights x0.01) or dead.
HEALTH_TESTS = """
import os

import models
import pytest
import torch


def model():
    kind = os.environ.get("BASELINE_MODEL", "healthy")
    if kind == "shrunk":
        net = models.healthy()
        with torch.no_grad():
            net[4].weight.mul_(0.01)
        return net
    return getattr(models, kind)()


@pytest.mark.neuraldbg(baseline=True)
def test_marked(neuraldbg):
    neuraldbg.smoke_train(model(), models.data(), models.loss, steps=20)


def test_explicit(neuraldbg):
    ndbg = neuraldbg.smoke_train(model(), models.data(), models.loss, steps=20)
    neuraldbg.assert_matches_baseline(ndbg)
"""

UPDATE = "--neuraldbg-update-baselines"


@pytest.fixture
def health(project: pytest.Pytester) -> pytest.Pytester:
    project.makepyfile(test_health=HEALTH_TESTS)
    return project


def stored(pytester: pytest.Pytester, test: str, module: str = "test_health") -> Path:
    return pytester.path / "__neuraldbg__" / module / f"{test}.json"


def update(pytester: pytest.Pytester, *args: str, passed: int = 2) -> pytest.RunResult:
    result = pytester.runpytest(UPDATE, *args)
    result.assert_outcomes(passed=passed)
    return result


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    doc = json.loads(path.read_text("utf-8"))
    change(doc)
    path.write_text(json.dumps(doc, indent=2), "utf-8")


def scale(values: list[float], factor: float) -> list[float]:
    return [v * factor for v in values]


def models_module() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(MODELS, namespace)
    return namespace


def first_grad_norm(model: torch.nn.Module, layer: int) -> float:
    """Plain torch: the gradient norm of a layer's parameters on the first batch, before any update."""
    m = models_module()
    x, y = m["data"]()[0]
    model.zero_grad()
    m["loss"](model(x), y).backward()
    return math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model[layer].parameters()))


# --- creating -----------------------------------------------------------------------------------------------------


def test_without_a_baseline_the_test_fails_with_the_file_and_the_command_that_writes_it(
    health: pytest.Pytester,
) -> None:
    result = health.runpytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ test_marked _*",
            "NeuralDBG baseline missing: __neuraldbg__/test_health/test_marked.json does not exist",
            "",
            "Create it by running the test with --neuraldbg-update-baselines, then review and commit the file:",
            "  pytest --neuraldbg-update-baselines test_health.py::test_marked",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "E       AssertionError: NeuralDBG baseline missing: __neuraldbg__/test_health/test_explicit.json does "
            "not exist",
            "*= neuraldbg =*",
            "2 watched runs: 0 unhealthy (gate: off)",
            "baselines: 2 missing",
        ]
    )
    assert not (health.path / "__neuraldbg__").exists()  # nothing is written without the flag


def test_updating_writes_one_readable_file_per_test_and_passes(health: pytest.Pytester) -> None:
    result = update(health)
    result.stdout.fnmatch_lines(
        [
            "baselines: 2 created",
            "baseline created: __neuraldbg__/test_health/test_explicit.json (test_health.py::test_explicit)",
            "baseline created: __neuraldbg__/test_health/test_marked.json (test_health.py::test_marked)",
        ]
    )
    text = stored(health, "test_marked").read_text("utf-8")
    doc = json.loads(text)
    assert (doc["format"], doc["version"], doc["test"], list(doc["runs"])) == (baseline.FORMAT, 1, "test_marked", ["1"])
    run = doc["runs"]["1"]
    assert run["points"] == ["first", "25%", "50%", "75%", "last"]
    assert run["at_step"] == [0, 5, 10, 14, 19]
    assert (run["steps_observed"], run["model"], run["verdicts"]) == (20, "Sequential", [])
    assert {layer: sorted(metrics) for layer, metrics in run["layers"].items()} == {
        "0": ["grad_norm", "update_ratio"],
        "1": ["dead_fraction"],
        "2": ["grad_norm", "update_ratio"],
        "3": ["dead_fraction"],
        "4": ["grad_norm", "update_ratio"],
    }
    assert run["environment"] == {
        "device": "cpu",
        "neuraldbg_version": neuraldbg.__version__,
        "python_version": platform.python_version(),
        "seed": 0,
        "steps": 20,
        "torch_version": str(torch.__version__),
    }
    assert run["loss"][-1] < run["loss"][0] and len(run["loss_gradient"]) == 5
    # the stored first gradient norm of layer '0' is the one plain torch computes, to 4 significant digits
    assert run["layers"]["0"]["grad_norm"][0] == pytest.approx(first_grad_norm(models_module()["healthy"](), 0), 1e-3)
    numbers = [v for m in run["layers"].values() for values in m.values() for v in values] + run["loss"]
    assert all(float(f"{v:.4g}") == v for v in numbers)
    # reviewable: sorted keys, two-space indentation, each metric's five values on one line
    assert text == baseline.dumps(doc)
    assert '      "at_step": [0, 5, 10, 14, 19],' in text.splitlines()
    assert [line.split('"')[1] for line in text.splitlines() if line.startswith('  "')] == [
        "format",
        "runs",
        "test",
        "version",
    ]
    # the same run again: the files stay as they are
    again = update(health)
    again.stdout.fnmatch_lines(["baselines: 2 unchanged"])
    assert "baseline created" not in again.stdout.str() and "baseline updated" not in again.stdout.str()


@pytest.mark.parametrize("where", ["env", "ini"])
def test_the_update_flag_can_come_from_the_environment_or_the_ini_file(
    health: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    if where == "env":
        monkeypatch.setenv("NEURALDBG_UPDATE_BASELINES", "1")
    else:
        health.makeini("[pytest]\nneuraldbg_update_baselines = true\n")
    health.runpytest().assert_outcomes(passed=2)
    assert stored(health, "test_marked").is_file() and stored(health, "test_explicit").is_file()


def test_a_test_that_fails_while_updating_writes_no_baseline(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_broken="""
        import models
        import pytest

        @pytest.mark.neuraldbg(baseline=True)
        def test_fails(neuraldbg):
            neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=5)
            assert False, "the test itself failed"
        """
    )
    result = project.runpytest(UPDATE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["baseline not written for test_broken.py::test_fails: the test did not pass"])
    assert not stored(project, "test_fails", "test_broken").exists()


def test_parametrized_tests_get_one_file_per_id_and_several_runs_share_their_tests_file(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    project.makepyfile(
        test_shapes="""
        import os

        import models
        import pytest
        import torch

        @pytest.mark.neuraldbg(baseline=True)
        @pytest.mark.parametrize("width", [8, 16])
        def test_width(neuraldbg, width):
            torch.manual_seed(0)  # smoke_train seeds its loop; the model's initialisation is the test's to seed
            neuraldbg.smoke_train(models.mlp(width), models.data(), models.loss, steps=5)

        @pytest.mark.neuraldbg(baseline=True)
        @pytest.mark.parametrize("case", ["a/b"])
        def test_odd_id(neuraldbg, case):
            torch.manual_seed(0)
            neuraldbg.smoke_train(models.mlp(4), models.data(), models.loss, steps=5)

        @pytest.mark.neuraldbg(baseline=True)
        def test_two_runs(neuraldbg):
            neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=5, name="small")
            if not os.environ.get("ONLY_SMALL"):
                neuraldbg.smoke_train(models.mlp(32), models.data(), models.loss, steps=5, name="wide")
        """
    )
    update(project, passed=4)
    directory = project.path / "__neuraldbg__" / "test_shapes"
    names = sorted(p.name for p in directory.iterdir())
    assert names[:3] == ["test_odd_id[a_b]-" + names[0].split("-")[1], "test_two_runs.json", "test_width[16].json"]
    assert names[3:] == ["test_width[8].json"] and names[0].endswith(".json")
    widths = json.loads((directory / "test_width[16].json").read_text("utf-8"))["runs"]["1"]["layers"]["0"]
    assert (
        widths["grad_norm"]
        != json.loads((directory / "test_width[8].json").read_text("utf-8"))["runs"]["1"]["layers"]["0"]["grad_norm"]
    )
    assert sorted(json.loads((directory / "test_two_runs.json").read_text("utf-8"))["runs"]) == ["small", "wide"]
    project.runpytest().assert_outcomes(passed=4)

    monkeypatch.setenv("ONLY_SMALL", "1")
    result = project.runpytest("-k", "two_runs")
    result.assert_outcomes(failed=1, deselected=3)
    result.stdout.fnmatch_lines(
        ["NeuralDBG baseline regression: run 'wide' is in the baseline but the test did not watch it"]
    )


# --- comparing ----------------------------------------------------------------------------------------------------


def test_an_unchanged_model_matches_its_baseline(health: pytest.Pytester) -> None:
    update(health)
    result = health.runpytest("--junitxml=junit.xml")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["baselines: 2 matched"])
    case = junit_cases(health.path / "junit.xml")["test_health::test_marked"]
    assert ("neuraldbg.baseline", "matched: __neuraldbg__/test_health/test_marked.json") in properties(case)


def test_gradients_100x_smaller_fail_the_test_with_a_table_naming_the_layers(
    health: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the change, in plain torch: the last layer's initial weights x0.01 shrink the gradients before it ~100x
    m = models_module()
    shrunk = m["healthy"]()
    with torch.no_grad():
        shrunk[4].weight.mul_(0.01)
    for layer in (0, 2):
        assert 80 < first_grad_norm(m["healthy"](), layer) / first_grad_norm(shrunk, layer) < 120
    update(health)

    monkeypatch.setenv("BASELINE_MODEL", "shrunk")
    result = health.runpytest("--junitxml=junit.xml")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ test_marked _*",
            "NeuralDBG baseline regression: grad_norm at '[02]' *x smaller at * (step *) (* -> *); +8 more",
            "",
            "Baseline: __neuraldbg__/test_health/test_marked.json",
            "",
            "Regressions beyond tolerance, worst first (the worst point of each metric and layer):",
            "metric * layer * point * baseline * now * tolerance",
            "grad_norm * [02] * (step *) * x10",
            "grad_norm * [02] * (step *) * x10",
            "... and 7 more points beyond tolerance",  # 9 points: 5 of '0' and 4 of '2' (its last is close)
            "",
            "If the change is intended, refresh the baseline and commit it:",
        ]
    )
    out = result.stdout.str()
    assert "grad_norm  4" not in out  # the shrunk layer's own gradient barely moves
    assert "new failure" not in out  # no fault threshold was crossed: the engine still calls the runs healthy
    assert "2 watched runs: 0 unhealthy" in out
    failure = junit_cases(health.path / "junit.xml")["test_health::test_explicit"].find("failure")
    assert failure is not None
    message = failure.get("message", "")
    assert message.startswith("AssertionError: NeuralDBG baseline regression: grad_norm at '")
    assert "\n" not in message.split("\n\n")[0]  # the verdict is one line, before the table


def test_a_new_failure_fails_with_the_engines_diagnosis(
    health: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    update(health)
    monkeypatch.setenv("BASELINE_MODEL", "dead")
    result = health.runpytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ test_marked _*",
            "NeuralDBG baseline regression: new failure dead_neurons at '3'; +* more",
            "",
            "Baseline: __neuraldbg__/test_health/test_marked.json",
            "",
            "Regressions beyond tolerance, worst first (the worst point of each metric and layer):",
            "metric * layer * point * baseline * now * tolerance",
            "verdict * 3 * - * - * dead_neurons * exact",  # a new failure leads
            "grad_norm * [02] * 0 * x10",  # the gradients it zeroes: infinitely far off
            "grad_norm * [02] * 0 * x10",
            "dead_fraction * 3 * first (step 0) * 0 * 1 * +0.1",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "NeuralDBG's diagnosis: training is unhealthy - dead_neurons at '3' from step 0 (confidence *)",
            "Dead neurons in '3' (ReLU)*",
            "Causal chain (root first):",
            "  root '3': * units dead (never positive), steps 0-*",
        ]
    )


def test_an_improvement_passes_and_is_listed_in_the_summary(
    health: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BASELINE_MODEL", "dead")
    update(health)
    monkeypatch.setenv("BASELINE_MODEL", "healthy")  # the dead ReLU was fixed
    result = health.runpytest()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "baselines: 2 improved",
            "baseline improved test_health.py::test_explicit: failure dead_neurons at '3' gone; "
            "dead_fraction at '3' 1 -> 0 at first (step 0) (+4 more points); "
            "grad_norm at '0' 0 -> * at first (step 0) (+4 more points); +* more",
            "  keep the improvement: pytest --neuraldbg-update-baselines test_health.py::test_explicit",
            "baseline improved test_health.py::test_marked: failure dead_neurons at '3' gone; *",
        ]
    )


def test_another_environment_warns_and_does_not_fail(health: pytest.Pytester) -> None:
    update(health)
    for test in ("test_marked", "test_explicit"):
        edit(stored(health, test), lambda doc: doc["runs"]["1"]["environment"].update(torch_version="1.0.0"))
    edit(stored(health, "test_marked"), lambda doc: doc["runs"]["1"]["environment"].update(device="cuda"))
    result = health.runpytest()
    result.assert_outcomes(passed=2, warnings=2)
    result.stdout.fnmatch_lines(
        [
            "*= warnings summary =*",
            "test_health.py::test_marked",
            "*NeuralDbgBaselineWarning: NeuralDBG baseline __neuraldbg__/test_health/test_marked.json was recorded "
            f"in another environment (torch_version 1.0.0 -> {torch.__version__}; device cuda -> cpu); training "
            "statistics may differ. Compared anyway; *",
        ]
    )
    result.stdout.fnmatch_lines(
        ["test_health.py::test_explicit", "*test_health.py:*: NeuralDbgBaselineWarning: *(torch_version 1.0.0 -> *"]
    )
    # a project that wants its baselines strict turns the warning into an error
    strict = health.runpytest("-W", "error::pytest_neuraldbg.NeuralDbgBaselineWarning")
    strict.assert_outcomes(failed=2)


# --- tolerances ---------------------------------------------------------------------------------------------------

TOLERANT_TEST = """
import models
import pytest

@pytest.mark.neuraldbg(baseline=True{marker})
def test_tolerant(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=20)
"""


@pytest.mark.parametrize(
    ("ini", "env", "cli", "marker", "shown"),
    [
        (None, None, None, None, "x10"),
        ("100", None, None, None, None),
        ("100", "20", None, None, "x20"),
        ("100", "20", "100", None, None),
        ("100", "20", "100", "20", "x20"),
    ],
    ids=["default", "ini", "env-over-ini", "cli-over-env", "marker-over-cli"],
)
def test_the_gradient_tolerance_follows_marker_cli_env_ini_default(
    project: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    ini: str | None,
    env: str | None,
    cli: str | None,
    marker: str | None,
    shown: str | None,
) -> None:
    project.makepyfile(test_tol=TOLERANT_TEST.format(marker=f", grad_tolerance={marker}" if marker else ""))
    update(project, passed=1)
    # the stored gradient norms of '0' 50x larger: this run's are 50x smaller than its baseline's
    path = stored(project, "test_tolerant", "test_tol")
    edit(
        path,
        lambda doc: doc["runs"]["1"]["layers"]["0"].update(
            grad_norm=scale(doc["runs"]["1"]["layers"]["0"]["grad_norm"], 50)
        ),
    )
    if ini:
        project.makeini(f"[pytest]\nneuraldbg_grad_tolerance = {ini}\n")
    if env:
        monkeypatch.setenv("NEURALDBG_GRAD_TOLERANCE", env)
    result = project.runpytest(*([f"--neuraldbg-grad-tolerance={cli}"] if cli else []))
    if shown is None:
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([f"grad_norm * 0 * (step *) * {shown}"])


def test_fraction_and_loss_tolerances_come_from_the_marker_and_the_command_line(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_dead="""
        import models
        import pytest

        @pytest.mark.neuraldbg(baseline=True)
        def test_strict(neuraldbg):
            neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=20)

        @pytest.mark.neuraldbg(baseline=True, fraction_tolerance=0.25, loss_tolerance=1.5)
        def test_lenient(neuraldbg):
            neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=20)
        """
    )
    update(project)

    def lower(doc: dict[str, Any]) -> None:  # the stored run: 80% of '3' dead (now 100%), half the loss
        run = doc["runs"]["1"]
        run["layers"]["3"]["dead_fraction"] = [0.8] * 5
        run["loss"] = scale(run["loss"], 0.5)

    for test in ("test_strict", "test_lenient"):
        edit(stored(project, test, "test_dead"), lower)
    result = project.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_strict _*",
            "NeuralDBG baseline regression: loss * at * (step *); +* more",  # twice the loss: 4 tolerances
            "*",
            "Regressions beyond tolerance, worst first (the worst point of each metric and layer):",
            "metric * layer * point * baseline * now * tolerance",
            "loss * - * (step *) * +25%",
            "dead_fraction * 3 * first (step 0) * 0.8 * 1 * +0.1",  # 0.2 above: 2 tolerances
            "... and 8 more points beyond tolerance",
        ]
    )
    loose = project.runpytest("--neuraldbg-fraction-tolerance=0.3", "--neuraldbg-loss-tolerance=2")
    loose.assert_outcomes(passed=2)


def test_bad_tolerances_name_their_source_and_what_was_expected(
    health: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = health.runpytest("--neuraldbg-grad-tolerance=0.5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        "--neuraldbg-grad-tolerance: invalid value '0.5' for grad_tolerance: expected a factor greater than 1"
    ) in result.stderr.str()
    monkeypatch.setenv("NEURALDBG_FRACTION_TOLERANCE", "2")
    result = health.runpytest()
    assert "env NEURALDBG_FRACTION_TOLERANCE: invalid value '2' for fraction_tolerance" in result.stderr.str()
    monkeypatch.delenv("NEURALDBG_FRACTION_TOLERANCE")
    health.makepyfile(
        test_marker="""
        import pytest

        @pytest.mark.neuraldbg(baseline=True, loss_tolerance="lots")
        def test_it(neuraldbg):
            pass
        """
    )
    result = health.runpytest("test_marker.py")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*marker @pytest.mark.neuraldbg on test_it: invalid value 'lots' for loss_tolerance: "
            "expected a number of at least 0*"
        ]
    )


# --- bad and stale files ------------------------------------------------------------------------------------------


def test_a_malformed_baseline_fails_its_test_with_the_file_the_problem_and_the_fix(health: pytest.Pytester) -> None:
    update(health)
    stored(health, "test_marked").write_text("{not json", "utf-8")
    edit(stored(health, "test_explicit"), lambda doc: doc.update(version=7))
    result = health.runpytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "NeuralDBG baseline __neuraldbg__/test_health/test_marked.json is not valid JSON at line 1, column 2: "
            "Expecting property name enclosed in double quotes",
            "",
            "Fix the file, or write it again from this run with --neuraldbg-update-baselines and review the diff:",
            "  pytest --neuraldbg-update-baselines test_health.py::test_marked",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "E       AssertionError: NeuralDBG baseline __neuraldbg__/test_health/test_explicit.json was written by a "
            "newer pytest-neuraldbg (format version 7; this one reads 1): upgrade pytest-neuraldbg"
        ]
    )
    assert "During handling of the above exception" not in result.stdout.str()  # no reader traceback
    update(health).stdout.fnmatch_lines(["baselines: 2 updated"])
    health.runpytest().assert_outcomes(passed=2)


def test_baselines_whose_test_is_gone_are_listed_unless_the_test_was_only_deselected(health: pytest.Pytester) -> None:
    update(health)
    directory = stored(health, "test_marked").parent
    (directory / "test_renamed.json").write_text(stored(health, "test_marked").read_text("utf-8"), "utf-8")
    result = health.runpytest()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "stale baseline: __neuraldbg__/test_health/test_renamed.json (no test test_renamed in test_health.py)",
            "  remove them with --neuraldbg-remove-stale-baselines, or rename them after a renamed test and run "
            "--neuraldbg-update-baselines",
        ]
    )
    assert result.stdout.str().count("stale baseline:") == 1
    assert (directory / "test_renamed.json").exists()  # listed, not deleted
    # deselected tests still exist: only the renamed one is stale
    deselected = health.runpytest("-k", "marked")
    deselected.assert_outcomes(passed=1, deselected=1)
    assert deselected.stdout.str().count("stale baseline:") == 1
    assert "stale baseline: __neuraldbg__/test_health/test_renamed.json" in deselected.stdout.str()
    # a module selected in part says nothing about the tests it did not collect
    partial = health.runpytest("test_health.py::test_marked")
    partial.assert_outcomes(passed=1)
    assert "stale baseline" not in partial.stdout.str()


# --- xdist --------------------------------------------------------------------------------------------------------

XDIST_TESTS = """
import models
import pytest

pytestmark = pytest.mark.neuraldbg(baseline=True)

def test_matches(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=20)

def test_regresses(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=20)

def test_improves(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=20)

def test_missing(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=20)
"""


def summary_lines(result: pytest.RunResult) -> list[str]:
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "= neuraldbg =" in line)
    end = next(i for i, line in enumerate(lines[start + 1 :], start + 1) if line.startswith("="))
    return lines[start + 1 : end]


def test_two_workers_give_the_same_outcomes_notes_and_files_as_one_process(project: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    project.makepyfile(test_many=XDIST_TESTS)
    update(project, "-p", "no:cacheprovider", passed=4)
    directory = project.path / "__neuraldbg__" / "test_many"
    written = {p.name: p.read_text("utf-8") for p in directory.iterdir()}
    assert len(written) == 4

    def layer0(doc: dict[str, Any]) -> dict[str, Any]:
        return dict(doc["runs"]["1"]["layers"]["0"])

    edit(
        directory / "test_regresses.json",
        lambda d: d["runs"]["1"]["layers"]["0"].update(grad_norm=scale(layer0(d)["grad_norm"], 100)),
    )
    edit(directory / "test_improves.json", lambda d: d["runs"]["1"]["layers"]["1"].update(dead_fraction=[0.5] * 5))
    edit(directory / "test_matches.json", lambda d: d["runs"]["1"]["environment"].update(torch_version="1.0.0"))
    (directory / "test_missing.json").unlink()
    (directory / "test_gone.json").write_text(written["test_matches.json"], "utf-8")

    serial = project.runpytest("-p", "no:cacheprovider")
    parallel = project.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    serial.assert_outcomes(passed=2, failed=2, warnings=1)
    parallel.assert_outcomes(passed=2, failed=2)  # (fresh workers add torch's own import-time warnings)
    for result in (serial, parallel):
        result.stdout.fnmatch_lines(
            ["*NeuralDbgBaselineWarning: NeuralDBG baseline __neuraldbg__/test_many/test_matches*"]
        )
    parallel.stdout.fnmatch_lines(["*2 workers*"])
    parallel.stdout.fnmatch_lines(["FAILED test_many.py::test_regresses - Failed: NeuralDBG baseline regression*"])
    assert summary_lines(parallel) == summary_lines(serial)
    assert summary_lines(serial) == [
        "4 watched runs: 0 unhealthy (gate: off)",
        "baselines: 1 regressed, 1 missing, 1 improved, 1 matched",
        "baseline improved test_many.py::test_improves: dead_fraction at '1' 0.5 -> 0 at first (step 0) "
        "(+4 more points)",
        "  keep the improvement: pytest --neuraldbg-update-baselines test_many.py::test_improves",
        "stale baseline: __neuraldbg__/test_many/test_gone.json (no test test_gone in test_many.py)",
        "  remove them with --neuraldbg-remove-stale-baselines, or rename them after a renamed test and run "
        "--neuraldbg-update-baselines",
    ]

    # updating on two workers: each worker writes the files of its tests, identical to one process's
    refreshed = project.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", UPDATE)
    refreshed.assert_outcomes(passed=4)
    refreshed.stdout.fnmatch_lines(["baselines: 1 created, 3 updated"])
    (directory / "test_gone.json").unlink()
    assert {p.name: p.read_text("utf-8") for p in directory.iterdir()} == written


# --- a baseline test that watched no run --------------------------------------------------------------------------

IDLE_TESTS = """
import models
import pytest

pytestmark = pytest.mark.neuraldbg(baseline=True)


def test_never_trains(neuraldbg):
    assert neuraldbg.runs == []


def test_no_fixture():
    pass


def test_empty_loop(neuraldbg):
    model = models.healthy()
    with neuraldbg(model):
        for batch in []:
            pass
"""


@pytest.mark.parametrize("args", [(), (UPDATE,)], ids=["comparing", "updating"])
def test_a_baseline_test_that_watched_no_run_fails_and_nothing_is_written(
    project: pytest.Pytester, args: tuple[str, ...]
) -> None:
    project.makepyfile(test_idle=IDLE_TESTS)
    result = project.runpytest(*args, "--neuraldbg-report=report")
    result.assert_outcomes(failed=3)
    for test in ("test_never_trains", "test_no_fixture"):
        result.stdout.fnmatch_lines(
            [
                f"*_ {test} _*",
                f"NeuralDBG baseline: test_idle.py::{test} has @pytest.mark.neuraldbg(baseline=True) but watched no "
                "training run, so there is nothing to compare with a baseline or to store in one",
                "",
                "Watch the training in the test (neuraldbg.smoke_train(...), or `with neuraldbg(model) as ndbg:` "
                "around the loop), or remove baseline=True from the tests that do not train.",
            ]
        )
    result.stdout.fnmatch_lines(
        [
            "*_ test_empty_loop _*",
            "NeuralDBG baseline: run '1' of test_idle.py::test_empty_loop took no training step (0 steps observed), "
            "so there is nothing to compare with a baseline or to store in one",
        ]
    )
    assert not (project.path / "__neuraldbg__").exists()
    summary = (project.path / "report" / "summary.md").read_text("utf-8")
    assert "| `test_idle.py::test_no_fixture` | **failed** | - (no run watched) | - | - | - | ❌ no run |" in summary
    assert "### ❌ `test_idle.py::test_no_fixture`: baseline no run\n\n- NeuralDBG baseline: " in summary
    assert summary.splitlines()[2].startswith("**3 of 3 tests watching training failed**")


LR_TEST = """
import os

import models
import pytest
import torch

@pytest.mark.neuraldbg(baseline=True)
def test_lr(neuraldbg):
    lr = float(os.environ.get("LR", "1e-3"))
    sgd = lambda params: torch.optim.SGD(params, lr=lr)
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=30, optimizer=sgd)
"""


def test_a_learning_rate_change_lists_each_regressed_metric_once_worst_first_and_improvements_apart(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    project.makepyfile(test_lr=LR_TEST)
    update(project, passed=1)
    monkeypatch.setenv("LR", "5e-2")  # 50x: larger updates everywhere (regressions), a lower loss (improvement)
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    body = text.split("Regressions beyond tolerance, worst first (the worst point of each metric and layer):\n")[1]
    table, _, rest = body.partition("\n\n")
    header, *rows, summary_line = table.splitlines()
    assert header.split() == ["metric", "layer", "point", "baseline", "now", "tolerance"]
    assert [row.split()[:2] for row in rows] == [["update_ratio", "0"], ["update_ratio", "2"], ["update_ratio", "4"]]
    assert re.fullmatch(r"\.\.\. and \d+ more points beyond tolerance", summary_line)  # the rest in one line
    assert rest.startswith("Better than the baseline (these pass):\n  loss ")  # improvements listed apart
    assert "loss" not in table
    first = next(line for line in text.splitlines() if line.startswith("NeuralDBG baseline regression: "))
    assert first.startswith("NeuralDBG baseline regression: update_ratio at '0' ")  # the worst one leads
