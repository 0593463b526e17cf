"""Training-health baselines without running pytest inside pytest: names, summaries, the file, the rules."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import neuraldbg
from pytest_neuraldbg import NeuralDbgBaselineWarning, baseline, options
from pytest_neuraldbg.baseline import (
    CHANGED,
    IMPROVED,
    POINTS,
    REGRESSED,
    BaselineCheck,
    BaselineError,
    Tolerances,
    compare_run,
    file_name,
    judge,
)
from pytest_neuraldbg.options import OptionError, Settings

# --- names ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("test_id", "name"),
    [
        ("test_it", "test_it.json"),
        ("test_it[8-relu]", "test_it[8-relu].json"),
        ("test_it[0.01]", "test_it[0.01].json"),
        ("TestClass::test_it[x=1,y=2]", "TestClass.test_it[x=1,y=2].json"),
    ],
)
def test_a_test_id_with_portable_characters_is_its_file_name(test_id: str, name: str) -> None:
    assert file_name(test_id) == name


def test_ids_that_lose_characters_get_a_hash_so_they_stay_distinct() -> None:
    slash, underscore, space = file_name("test[a/b]"), file_name("test[a_b]"), file_name("test[a b]")
    assert slash.startswith("test[a_b]-") and space.startswith("test[a_b]-") and underscore == "test[a_b].json"
    assert len({slash, underscore, space}) == 3
    assert re.fullmatch(r"[A-Za-z0-9._\-\[\]=+,@]+", slash)


def test_long_ids_are_cut_and_windows_device_names_are_escaped() -> None:
    long_a, long_b = file_name("test[" + "x" * 300 + "1]"), file_name("test[" + "x" * 300 + "2]")
    assert len(long_a) <= baseline.MAX_NAME + 5 and long_a != long_b
    assert file_name("con") == "_con.json"


def test_the_baseline_of_a_test_lives_next_to_its_module() -> None:
    module = Path("/repo/tests/test_training.py")
    assert baseline.path_for(module, "test_it[1]") == Path("/repo/tests/__neuraldbg__/test_training/test_it[1].json")
    assert baseline.shown(Path("/repo/tests/x.json"), Path("/repo")) == "tests/x.json"
    assert baseline.shown(Path("/elsewhere/x.json"), Path("/repo")) == "/elsewhere/x.json"


# --- a run as data ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.123456789, 0.1235), (123456.0, 123500.0), (1.23456e-9, 1.235e-09), (0.0, 0.0), (math.inf, "inf")],
)
def test_values_keep_four_significant_digits_and_non_finite_ones_become_strings(value: float, expected: Any) -> None:
    assert baseline.rounded(value) == expected
    assert baseline.rounded(math.nan) == "nan" and baseline.rounded(-math.inf) == "-inf"


def test_the_fixed_points_are_first_last_and_the_quarters_between() -> None:
    assert baseline.targets(0, 29) == [0, 7, 15, 22, 29]
    assert baseline.targets(0, 19) == [0, 5, 10, 14, 19]
    assert baseline.targets(4, 4) == [4] * len(POINTS)


def _mlp(dead: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    if dead:
        with torch.no_grad():
            model[0].bias.fill_(-50.0)
    return model


def _train(model: nn.Module, steps: int = 20) -> neuraldbg.NeuralDbg:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with neuraldbg.NeuralDbg(model) as dbg:
        for _ in range(steps):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            dbg.observe_loss(loss)
            loss.backward()
            opt.step()
    return dbg


def test_a_summary_holds_the_nearest_recorded_value_of_each_metric_at_each_point() -> None:
    dbg = _train(_mlp())
    observed = baseline.summarise(dbg, {"device": "cpu"})
    summary = observed.summary
    assert summary["points"] == ["first", "25%", "50%", "75%", "last"]
    assert summary["at_step"] == [0, 5, 10, 14, 19]  # the loss is recorded every step, 0 to 19
    assert summary["steps_observed"] == 20 and summary["verdicts"] == [] and observed.hypotheses == []
    assert set(summary["layers"]) == {"0", "1", "2", "3", "4"}
    assert set(summary["layers"]["0"]) == {"grad_norm", "update_ratio"}
    assert set(summary["layers"]["1"]) == {"dead_fraction"}
    assert set(summary["layers"]["3"]) == {"saturated_fraction"}
    # oracle: the nearest recorded point, found by brute force over the whole series
    for (metric, layer), name in (
        (("grad_norm", "2"), None),
        (("update_ratio", "4"), None),
        (("loss", ""), "loss"),
        (("loss_gradient", ""), "loss_gradient"),
    ):
        points = dbg.history.get(metric, layer).points()
        expected = [
            baseline.rounded(min(points, key=lambda p, t=t: (abs(p[0] - t), p[0]))[1]) for t in [0, 5, 10, 14, 19]
        ]
        stored = summary[name] if name else summary["layers"][layer][metric]
        assert stored == expected
    # the first gradient norm of layer '0' agrees with plain torch
    model = _mlp()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
    F.mse_loss(model(x), y).backward()
    brute = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model[0].parameters()))
    assert summary["layers"]["0"]["grad_norm"][0] == pytest.approx(brute, rel=1e-3)


def test_a_summary_lists_each_failure_by_kind_and_root_layer() -> None:
    observed = baseline.summarise(_train(_mlp(dead=True)), {})
    assert observed.summary["verdicts"] == [{"kind": "dead_neurons", "layer": "1"}]
    assert observed.summary["layers"]["1"]["dead_fraction"] == [1.0] * 5
    assert observed.hypotheses[0]["kind"] == "dead_neurons" and observed.hypotheses[0]["explanation"]


def test_the_environment_comes_from_the_run_and_the_fixture() -> None:
    env = baseline.environment(_train(_mlp(), steps=2), device="cpu", origin={"seed": 3, "steps": 2})
    assert env == {
        "torch_version": str(torch.__version__),
        "python_version": env["python_version"],
        "neuraldbg_version": neuraldbg.__version__,
        "device": "cpu",
        "seed": 3,
        "steps": 2,
    }
    assert baseline.device_of(_mlp()) == "cpu" and baseline.device_of(nn.ReLU()) == "cpu"


def test_a_saved_trace_summarises_like_the_live_run(tmp_path: Path) -> None:
    dbg = _train(_mlp(dead=True))
    trace = neuraldbg.load(dbg.save(tmp_path / "trace.json"))
    live = baseline.summarise(dbg, baseline.environment(dbg))
    assert baseline.summarise(trace, baseline.environment(trace)).summary == live.summary


def test_the_fixture_stores_its_runs_by_name_and_wants_a_name_for_other_debuggers(tmp_path: Path) -> None:
    from pytest_neuraldbg.fixture import NeuralDbgFixture

    settings = Settings(update_baselines=True)
    fixture = NeuralDbgFixture(settings, None, _check(tmp_path, update_baselines=True))
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g))]
    run = fixture.smoke_train(_mlp(), data, F.mse_loss, steps=4, seed=7)
    fixture.assert_matches_baseline(run)
    saved = neuraldbg.load(run.save(tmp_path / "trace.json"))
    with pytest.raises(ValueError, match=re.escape("was not created by the neuraldbg fixture; pass name=...")):
        fixture.assert_matches_baseline(saved)
    fixture.assert_matches_baseline(saved, name="saved")
    model = _mlp()  # the debugger holds its model weakly: keep a reference
    with fixture(model) as live, pytest.raises(RuntimeError, match="run '2' is still being watched"):
        fixture.assert_matches_baseline(live)
    fixture.finish_baseline(passed=True)
    runs = json.loads((tmp_path / "__neuraldbg__" / "test_m" / "test_it.json").read_text("utf-8"))["runs"]
    assert sorted(runs) == ["1", "saved"]
    assert {k: runs["1"]["environment"][k] for k in ("device", "seed", "steps")} == {
        "device": "cpu",
        "seed": 7,
        "steps": 4,
    }
    assert "seed" not in runs["saved"]["environment"] and "device" not in runs["saved"]["environment"]
    assert runs["saved"]["layers"] == runs["1"]["layers"]


@pytest.mark.parametrize("own_generator", [False, True], ids=["global-generator", "own-generator"])
def test_smoke_train_shuffles_a_dataloader_the_same_way_every_time(own_generator: bool) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    from pytest_neuraldbg.fixture import NeuralDbgFixture

    g = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    summaries, orders = [], []
    for disturb in (1, 2):
        generator = torch.Generator().manual_seed(100 + disturb) if own_generator else None  # a different state
        loader = DataLoader(dataset, batch_size=8, shuffle=True, generator=generator)
        before = generator.get_state() if generator is not None else None
        torch.manual_seed(disturb)  # the global state differs too: only smoke_train's seed may matter
        model = _mlp()
        run = NeuralDbgFixture(Settings()).smoke_train(model, loader, F.mse_loss, steps=12, seed=5)
        summaries.append(baseline.summarise(run, {}).summary)
        if generator is not None:
            assert torch.equal(generator.get_state(), before)  # the loader's generator is given back as it was
        with seeded(loader):
            orders.append([float(x[0, 0]) for x, _ in loader])
    assert summaries[0] == summaries[1]
    assert orders[0] == orders[1]


def seeded(loader: Any) -> Any:
    from pytest_neuraldbg.smoke import _Seeded, loader_generators

    return _Seeded(5, loader_generators(loader))


# --- the file ----------------------------------------------------------------------------------------------------


def _run(**changes: Any) -> dict[str, Any]:
    run: dict[str, Any] = {
        "at_step": [0, 5, 10, 14, 19],
        "points": [label for label, _ in POINTS],
        "steps_observed": 20,
        "model": "Sequential",
        "layers": {
            "0": {"grad_norm": [1.0, 1.0, 1.0, 1.0, 1.0], "update_ratio": [0.01] * 5},
            "1": {"dead_fraction": [0.1] * 5},
        },
        "loss": [2.0, 1.5, 1.0, 0.8, 0.5],
        "loss_gradient": [1.0] * 5,
        "verdicts": [],
        "environment": {"torch_version": "2.13.0", "device": "cpu", "seed": 0, "steps": 20},
    }
    run.update(changes)
    return run


def test_the_file_is_pretty_sorted_json_with_short_lists_on_one_line(tmp_path: Path) -> None:
    doc = baseline.document("test_it", {"1": _run()})
    text = baseline.dumps(doc)
    assert json.loads(text) == doc
    assert '      "at_step": [0, 5, 10, 14, 19],\n' in text
    assert '          "grad_norm": [1.0, 1.0, 1.0, 1.0, 1.0],\n' in text
    keys = [line.split('"')[1] for line in text.splitlines() if line.startswith('  "')]
    assert keys == sorted(keys) == ["format", "runs", "test", "version"]
    path = tmp_path / "d" / "test_it.json"
    assert baseline.write(path, doc) == "created"
    assert baseline.write(path, doc) == "unchanged"
    assert baseline.write(path, baseline.document("test_it", {"1": _run(model="MLP")})) == "updated"
    assert baseline.load(path) == baseline.document("test_it", {"1": _run(model="MLP")})
    assert baseline.load(tmp_path / "absent.json") is None
    assert [p.name for p in path.parent.iterdir()] == ["test_it.json"]  # no temporary file left behind


NOT_AN_OBJECT = "is not a NeuralDBG baseline: expected an object with \"format\": 'pytest-neuraldbg baseline', "


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{oops", "is not valid JSON at line 1, column 2: Expecting property name enclosed in double quotes"),
        ("[]", NOT_AN_OBJECT + "got an array"),
        ("null", NOT_AN_OBJECT + "got null"),  # not "missing": the file is there
        ('"x"', NOT_AN_OBJECT + "got a string 'x'"),
        ('{"format": "pytest-neuraldbg baseline", "version": 9, "runs": {}}', "was written by a newer"),
        ('{"format": "pytest-neuraldbg baseline", "version": 0, "runs": {}}', "has format version 0"),
        ('{"format": "pytest-neuraldbg baseline", "version": 1, "runs": []}', "runs: expected an object"),
    ],
)
def test_a_bad_file_says_what_is_wrong(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "b.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BaselineError, match="^" + re.escape(problem)):
        baseline.load(path)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"at_step": [0, 1]}, "runs.1.at_step: expected a list of 5 step numbers"),
        ({"layers": {"0": {"grad_norm": [1, 2]}}}, "runs.1.layers.0.grad_norm: expected a list of 5 numbers"),
        ({"layers": {"0": {"speed": [1] * 5}}}, "runs.1.layers.0.speed: unknown metric"),
        ({"loss": ["fast"] * 5}, "runs.1.loss: expected a list of 5 numbers"),
        ({"verdicts": [{"kind": "dead_neurons"}]}, "runs.1.verdicts: expected a list of"),
        ({"environment": None}, "runs.1.environment: expected an object"),
    ],
)
def test_a_damaged_run_names_the_place_in_the_file(change: dict[str, Any], problem: str) -> None:
    with pytest.raises(BaselineError, match="^" + re.escape(problem)):
        baseline.validate(baseline.document("t", {"1": _run(**change)}))


# --- the rules ---------------------------------------------------------------------------------------------------

TOL = Tolerances()


@pytest.mark.parametrize(
    ("metric", "base", "now", "expected"),
    [
        ("grad_norm", 1.0, 9.9, None),  # within a factor of 10
        ("grad_norm", 1.0, 0.101, None),
        ("grad_norm", 1.0, 10.5, REGRESSED),  # either direction
        ("grad_norm", 1.0, 0.0095, REGRESSED),
        ("update_ratio", 0.0, 0.0, None),  # zero is zero
        ("update_ratio", 0.0, 1e-14, None),  # below 1e-12 counts as zero
        ("update_ratio", 0.0, 1e-3, REGRESSED),
        ("loss_gradient", "nan", "nan", None),
        ("grad_norm", 1.0, "inf", REGRESSED),  # finite -> non-finite
        ("grad_norm", "inf", 1.0, IMPROVED),  # non-finite -> finite
        ("dead_fraction", 0.2, 0.3, None),  # +0.1 is within tolerance
        ("dead_fraction", 0.2, 0.35, REGRESSED),
        ("saturated_fraction", 0.9, 0.1, IMPROVED),
        ("loss", 1.0, 1.25, None),
        ("loss", 1.0, 1.3, REGRESSED),
        ("loss", 1.0, 0.5, IMPROVED),
        ("loss", -2.0, -1.0, REGRESSED),  # relative to |baseline|: -1 is 50% higher than -2
        ("loss", 0.0, 0.1, REGRESSED),
        ("loss", 1.0, "nan", REGRESSED),
    ],
)
def test_each_metric_is_judged_by_its_own_rule(metric: str, base: Any, now: Any, expected: str | None) -> None:
    assert judge(metric, base, now, TOL) == expected


def test_tolerances_widen_each_rule_and_are_shown_in_its_units() -> None:
    wide = Tolerances(grad=200.0, fraction=0.5, loss=1.0)
    assert judge("grad_norm", 1.0, 150.0, wide) is None and judge("grad_norm", 1.0, 150.0, TOL) == REGRESSED
    assert judge("dead_fraction", 0.0, 0.4, wide) is None
    assert judge("loss", 1.0, 1.9, wide) is None
    assert [TOL.text(m) for m in ("grad_norm", "dead_fraction", "loss", "verdict")] == ["x10", "+0.1", "+25%", "exact"]
    settings = Settings(grad_tolerance=3.0, fraction_tolerance=0.2, loss_tolerance=0.5)
    assert Tolerances.of(settings) == Tolerances(3.0, 0.2, 0.5)


def test_a_new_failure_is_a_regression_and_a_gone_one_an_improvement() -> None:
    dead = [{"kind": "dead_neurons", "layer": "1"}]
    worse = compare_run("1", _run(), _run(verdicts=dead), TOL)
    assert [(r.metric, r.layer, r.change, r.what) for r in worse.rows] == [
        ("verdict", "1", REGRESSED, "new failure dead_neurons at '1'")
    ]
    better = compare_run("1", _run(verdicts=dead), _run(), TOL)
    assert [(r.change, r.what) for r in better.rows] == [(IMPROVED, "failure dead_neurons at '1' gone")]
    moved = compare_run("1", _run(verdicts=dead), _run(verdicts=[{"kind": "dead_neurons", "layer": "3"}]), TOL)
    assert {r.change for r in moved.rows} == {REGRESSED, IMPROVED}  # a failure that moved is a new failure


def test_gradients_100x_smaller_regress_at_every_point_with_the_factor_in_the_phrase() -> None:
    layers = _run()["layers"]
    small = {**layers, "0": {**layers["0"], "grad_norm": [0.01] * 5}}
    result = compare_run("1", _run(), _run(layers=small), TOL)
    assert [(r.metric, r.layer, r.point, r.change) for r in result.rows] == [
        ("grad_norm", "0", f"{label} (step {step})", REGRESSED) for (label, _), step in zip(POINTS, [0, 5, 10, 14, 19])
    ]
    assert result.rows[0].what == "grad_norm at '0' 100x smaller at first (step 0) (1 -> 0.01)"
    assert baseline.table(result.rows[:1]) == [
        "metric     layer  point           baseline  now   tolerance  change",
        "grad_norm  0      first (step 0)  1         0.01  x10        regressed",
    ]


def test_gradient_changes_that_come_with_a_fixed_failure_are_changes_not_regressions() -> None:
    dead = [{"kind": "dead_neurons", "layer": "1"}]
    layers = _run()["layers"]
    zero = {**layers, "0": {"grad_norm": [0.0] * 5, "update_ratio": [0.0] * 5}, "1": {"dead_fraction": [1.0] * 5}}
    result = compare_run("1", _run(layers=zero, verdicts=dead), _run(), TOL)
    assert not result.regressions
    assert {(r.metric, r.change) for r in result.rows} == {
        ("verdict", IMPROVED),
        ("grad_norm", CHANGED),
        ("update_ratio", CHANGED),
        ("dead_fraction", IMPROVED),
    }
    assert baseline.grouped(result.rows) == [
        "failure dead_neurons at '1' gone",
        "dead_fraction at '1' 1 -> 0.1 at first (step 0) (+4 more points)",
        "grad_norm at '0' 0 -> 1 at first (step 0) (+4 more points)",
        "update_ratio at '0' 0 -> 0.01 at first (step 0) (+4 more points)",
    ]


def test_a_layer_or_metric_on_one_side_only_is_a_regression_and_the_loss_is_optional() -> None:
    layers = _run()["layers"]
    now = _run(layers={**layers, "5": {"dead_fraction": [0.0] * 5}})
    del now["loss"]
    result = compare_run("1", _run(), now, TOL)
    assert [(r.metric, r.layer, r.change, r.what) for r in result.rows] == [
        ("dead_fraction", "5", REGRESSED, "dead_fraction at '5' is not in the baseline")
    ]
    gone = compare_run("1", _run(), _run(layers={"1": layers["1"]}), TOL)
    assert {r.what for r in gone.rows} == {
        "grad_norm at '0' is no longer recorded",
        "update_ratio at '0' is no longer recorded",
    }


def test_environment_differences_are_listed_and_python_is_not_checked() -> None:
    base = _run(environment={"torch_version": "2.12.0", "device": "cpu", "python_version": "3.10.1"})
    now = _run(environment={"torch_version": "2.13.0", "device": "cuda", "python_version": "3.12.0"})
    assert baseline.environment_differences(base, now) == ["torch_version 2.12.0 -> 2.13.0", "device cpu -> cuda"]
    loop = baseline.environment_differences(_run(environment={}), _run(environment={}, steps_observed=30))
    assert loop == ["steps_observed 20 -> 30"]  # a hand-written loop: the number of steps observed


# --- one test's check ------------------------------------------------------------------------------------------


class Failed(Exception):
    pass


def fail(text: str) -> NoReturn:
    raise Failed(text)


def _check(tmp_path: Path, **settings: Any) -> BaselineCheck:
    path = tmp_path / "__neuraldbg__" / "test_m" / "test_it.json"
    return BaselineCheck(
        path=path,
        shown_path="__neuraldbg__/test_m/test_it.json",
        nodeid="test_m.py::test_it",
        test_id="test_it",
        settings=Settings(**settings),
    )


def test_a_missing_baseline_fails_with_the_command_and_updating_writes_it(tmp_path: Path) -> None:
    check = _check(tmp_path)
    with pytest.raises(Failed) as info:
        check.check({"1": baseline.Observed(_run())}, complete=True, fail=fail)
    assert str(info.value).splitlines() == [
        "NeuralDBG baseline missing: __neuraldbg__/test_m/test_it.json does not exist",
        "",
        "Create it by running the test with --neuraldbg-update-baselines, then review and commit the file:",
        "  pytest --neuraldbg-update-baselines test_m.py::test_it",
    ]
    assert check.notes[-1]["status"] == "missing"

    update = _check(tmp_path, update_baselines=True)
    update.check({"1": baseline.Observed(_run())}, complete=True, fail=fail)
    update.finish(passed=True)
    assert update.notes[-1]["status"] == "created"
    assert baseline.load(update.path) == baseline.document("test_it", {"1": _run()})


def test_updating_a_test_that_failed_writes_nothing(tmp_path: Path) -> None:
    update = _check(tmp_path, update_baselines=True)
    update.check({"1": baseline.Observed(_run())}, complete=False, fail=fail)
    update.finish(passed=False)
    assert not update.path.exists() and update.notes[-1]["status"] == "not written"


def test_a_regression_fails_with_a_verdict_line_a_table_and_the_diagnosis(tmp_path: Path) -> None:
    check = _check(tmp_path)
    baseline.write(check.path, baseline.document("test_it", {"1": _run()}))
    hypothesis = {"kind": "dead_neurons", "summary": "dead_neurons at '1' from step 0", "explanation": "It died."}
    hypothesis["chain"] = [{"text": "activation initial -> dead at '1'", "cause": None}]
    now = _run(verdicts=[{"kind": "dead_neurons", "layer": "1"}], loss=[4.0] * 5)
    with pytest.raises(Failed) as info:
        check.check({"1": baseline.Observed(now, [hypothesis])}, complete=True, fail=fail)
    lines = str(info.value).splitlines()
    assert lines[0] == "NeuralDBG baseline regression: new failure dead_neurons at '1'; +5 more"
    assert lines[2] == "Baseline: __neuraldbg__/test_m/test_it.json"
    assert lines[4] == "Regressions beyond tolerance, worst first (the worst point of each metric and layer):"
    assert lines[5].split() == ["metric", "layer", "point", "baseline", "now", "tolerance"]
    assert lines[6].split() == ["verdict", "1", "-", "-", "dead_neurons", "exact"]
    # the worst point of the loss: 0.5 -> 4 at the end (8x) is further off than 2 -> 4 at the start
    assert lines[7].split() == ["loss", "-", "last", "(step", "19)", "0.5", "4", "+25%"]
    assert lines[8] == "... and 4 more points beyond tolerance"
    assert "NeuralDBG's diagnosis: training is unhealthy - dead_neurons at '1' from step 0" in lines
    assert lines[-2:] == [
        "If the change is intended, refresh the baseline and commit it:",
        "  pytest --neuraldbg-update-baselines test_m.py::test_it",
    ]
    assert check.notes[-1]["status"] == "regressed"


def test_runs_are_matched_by_name_and_a_complete_check_wants_every_stored_run(tmp_path: Path) -> None:
    check = _check(tmp_path)
    baseline.write(check.path, baseline.document("test_it", {"a": _run(), "b": _run()}))
    check.check({"a": baseline.Observed(_run())}, complete=False, fail=fail)  # one at a time: fine
    assert check.notes[-1]["status"] == "matched"
    with pytest.raises(Failed, match="run 'b' is in the baseline but the test did not watch it"):
        check.check({}, complete=True, fail=fail)
    with pytest.raises(Failed, match=r"run 'c' has no baseline in this file \(runs there: a, b\)"):
        check.check({"c": baseline.Observed(_run())}, complete=False, fail=fail)


def test_another_environment_warns_and_still_compares(tmp_path: Path) -> None:
    check = _check(tmp_path)
    baseline.write(check.path, baseline.document("test_it", {"1": _run()}))
    moved = _run(environment={**_run()["environment"], "torch_version": "2.14.0"}, loss=[1.0, 1.0, 1.0, 0.8, 0.5])
    with pytest.warns(NeuralDbgBaselineWarning, match=r"another environment \(torch_version 2.13.0 -> 2.14.0\)"):
        check.check({"1": baseline.Observed(moved)}, complete=True, fail=fail)
    assert check.notes[-1]["status"] == "improved"  # compared anyway: the loss fell
    assert check.notes[-1]["lines"] == ["loss 2 -> 1 at first (step 0) (+1 more point)"]


def test_a_file_holding_json_null_is_invalid_not_missing(tmp_path: Path) -> None:
    check = _check(tmp_path)
    check.path.parent.mkdir(parents=True)
    check.path.write_text("null\n", encoding="utf-8")
    with pytest.raises(Failed) as info:
        check.check({"1": baseline.Observed(_run())}, complete=True, fail=fail)
    assert str(info.value).splitlines()[0] == (
        "NeuralDBG baseline __neuraldbg__/test_m/test_it.json is not a NeuralDBG baseline: "
        "expected an object with \"format\": 'pytest-neuraldbg baseline', got null"
    )
    assert check.notes[-1]["status"] == "invalid"


@pytest.mark.parametrize("in_the_way", ["folder", "link", "file as its folder"])
def test_a_baseline_that_cannot_be_written_fails_the_test_with_the_file_and_what_is_in_the_way(
    tmp_path: Path, in_the_way: str
) -> None:
    update = _check(tmp_path, update_baselines=True)
    if in_the_way == "folder":
        update.path.mkdir(parents=True)
        problem = "is a directory; expected the path of a regular file to write"
    elif in_the_way == "link":
        update.path.parent.mkdir(parents=True)
        update.path.symlink_to(tmp_path / "elsewhere.json")
        problem = "is a symbolic link; NeuralDBG writes only regular files"
    else:
        update.path.parent.parent.mkdir(parents=True)
        update.path.parent.write_text("", encoding="utf-8")  # __neuraldbg__/test_m is a file
        problem = "cannot be written: Not a directory"
    update.check({"1": baseline.Observed(_run())}, complete=True, fail=fail)
    with pytest.raises(Failed) as info:
        update.finish(passed=True, fail=fail)
    first, blank, fix, command = str(info.value).splitlines()
    assert first.startswith(f"NeuralDBG baseline __neuraldbg__/test_m/test_it.json {problem}")
    assert str(tmp_path) not in first  # the file is named once, as the test's baseline, not by the writer
    assert (blank, command) == ("", "  pytest --neuraldbg-update-baselines test_m.py::test_it")
    assert fix.startswith("Nothing was written.")
    assert update.notes[-1]["status"] == "invalid" and update.notes[-1]["text"] == str(info.value)
    assert update.notes[-1]["lines"][0].startswith(problem)
    assert not (tmp_path / "elsewhere.json").exists()  # a link's target is not written either


def test_a_bad_file_fails_with_the_file_the_problem_and_the_fix(tmp_path: Path) -> None:
    check = _check(tmp_path)
    check.path.parent.mkdir(parents=True)
    check.path.write_text('{"format": "something else"}', encoding="utf-8")
    with pytest.raises(Failed) as info:
        check.check({"1": baseline.Observed(_run())}, complete=True, fail=fail)
    first, _, fix, command = str(info.value).splitlines()
    assert first == (
        "NeuralDBG baseline __neuraldbg__/test_m/test_it.json is not a NeuralDBG baseline: "
        "expected \"format\": 'pytest-neuraldbg baseline', got 'something else'"
    )
    assert fix.startswith("Fix the file, or write it again from this run with --neuraldbg-update-baselines")
    assert command == "  pytest --neuraldbg-update-baselines test_m.py::test_it"


# --- stale files -------------------------------------------------------------------------------------------------


def test_stale_files_are_those_no_collected_or_deselected_test_uses(tmp_path: Path) -> None:
    module, other = tmp_path / "test_a.py", tmp_path / "test_b.py"
    module.touch()  # both modules exist: the folder of a deleted module is stale whatever was collected
    other.touch()
    directory = baseline.directory_for(module)
    directory.mkdir(parents=True)
    for name in ("test_kept", "test_deselected", "test_gone[1]"):
        baseline.write(directory / file_name(name), baseline.document(name, {}))
    (directory / "notes.txt").write_text("not a baseline")
    baseline.directory_for(other).mkdir(parents=True)
    (baseline.directory_for(other) / "test_x.json").write_text("{}")
    tests = [(module, "test_kept"), (module, "test_deselected"), (other, "test_y")]
    found = baseline.stale_files(tests, partial=lambda m: m == other)
    assert found == [(directory / "test_gone[1].json", "test_gone[1]")]  # test_b.py was selected in part
    assert baseline.stale_files([(module, "test_kept")], partial=lambda m: True) == []


def test_stale_files_name_the_tests_of_modules_that_keep_baselines_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session collects thousands of tests whose modules keep no baseline: their file names are never computed
    (each is a few microseconds, paid after collection in every session with the plugin installed)."""
    from pytest_neuraldbg.baseline import stale

    named: list[str] = []
    monkeypatch.setattr(stale, "file_name", lambda test_id: named.append(test_id) or file_name(test_id))
    kept, bare = tmp_path / "test_kept.py", tmp_path / "test_bare.py"
    kept.touch()
    bare.touch()
    baseline.directory_for(kept).mkdir(parents=True)
    (baseline.directory_for(kept) / "test_old.json").write_text("{}")
    tests = [(bare, f"test_{i}") for i in range(100)] + [(kept, "test_new")]
    found = baseline.stale_files(tests, partial=lambda m: False)
    assert [path.name for path, _ in found] == ["test_old.json"]
    assert named == ["test_new"]


# --- options -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "bad", "expected"),
    [
        ("grad_tolerance", "1", "expected a factor greater than 1"),
        ("grad_tolerance", "ten", "expected a factor greater than 1"),
        ("grad_tolerance", "inf", "expected a factor greater than 1"),
        ("fraction_tolerance", "1.5", "expected a number between 0 and 1"),
        ("loss_tolerance", "-0.1", "expected a number of at least 0"),
        ("update_baselines", "maybe", "expected true or false"),
    ],
)
def test_baseline_options_reject_bad_values_saying_what_they_expect(name: str, bad: str, expected: str) -> None:
    with pytest.raises(OptionError, match=expected):
        options.BY_NAME[name].parse(bad)


def test_baseline_options_follow_the_precedence_marker_cli_env_ini() -> None:
    ini = {"neuraldbg_grad_tolerance": "3", "neuraldbg_update_baselines": "yes", "neuraldbg_loss_tolerance": "0.5"}
    config = SimpleNamespace(
        getoption=lambda dest: {"neuraldbg_grad_tolerance": "5"}.get(dest),
        getini=lambda name: ini.get(name, ""),
        inipath=Path("/p/pytest.ini"),
        invocation_params=SimpleNamespace(dir=Path("/p")),
        option=SimpleNamespace(override_ini=[]),
    )
    settings = options.resolve(config, env={"NEURALDBG_GRAD_TOLERANCE": "4", "NEURALDBG_LOSS_TOLERANCE": "0.75"})
    assert (settings.grad_tolerance, settings.source("grad_tolerance")) == (5.0, "--neuraldbg-grad-tolerance")
    assert (settings.loss_tolerance, settings.source("loss_tolerance")) == (0.75, "env NEURALDBG_LOSS_TOLERANCE")
    assert settings.update_baselines is True and settings.fraction_tolerance == 0.1
    marked, engine = options.apply_marker(settings, {"grad_tolerance": 50, "baseline": True}, "test_x")
    assert (marked.grad_tolerance, marked.baseline, engine) == (50.0, True, {})
    assert marked.source("grad_tolerance") == "marker @pytest.mark.neuraldbg on test_x"
    with pytest.raises(OptionError, match="invalid value 'yes please' for baseline: expected true or false"):
        options.apply_marker(settings, {"baseline": "yes please"}, "test_x")


def test_severity_counts_tolerances_so_different_metrics_rank_together() -> None:
    assert baseline.severity("grad_norm", 1.0, 100.0, TOL) == pytest.approx(2.0)  # two decades, tolerance one
    assert baseline.severity("dead_fraction", 0.1, 0.4, TOL) == pytest.approx(3.0)  # +0.3 against +0.1
    assert baseline.severity("loss", 1.0, 1.5, TOL) == pytest.approx(2.0)  # +50% against +25%
    assert baseline.severity("grad_norm", 1.0, "nan", TOL) == math.inf


def test_a_regression_shows_the_worst_point_of_each_metric_and_layer_first_and_improvements_apart(
    tmp_path: Path,
) -> None:
    check = _check(tmp_path)
    before = _run(layers={**_run()["layers"], "1": {"dead_fraction": [0.4] * 5}})
    baseline.write(check.path, baseline.document("test_it", {"1": before}))
    faster = {  # what a learning rate raised 50x does: bigger updates and gradients, fewer dead units, lower loss
        "0": {"grad_norm": [1.0, 20.0, 30.0, 20.0, 20.0], "update_ratio": [0.5] * 5},
        "1": {"dead_fraction": [0.4, 0.4, 0.0, 0.0, 0.0]},
    }
    now = _run(layers=faster, loss=[2.0, 1.0, 0.5, 0.4, 0.2])
    with pytest.raises(Failed) as info:
        check.check({"1": baseline.Observed(now)}, complete=True, fail=fail)
    text = str(info.value)
    assert text.splitlines()[0] == (
        "NeuralDBG baseline regression: update_ratio at '0' 50x larger at first (step 0) (0.01 -> 0.5); +8 more"
    )
    regressions = text.split("Regressions beyond tolerance, worst first (the worst point of each metric and layer):\n")
    table, rest = regressions[1].split("\n\n", 1)
    assert [row.split()[:3] for row in table.splitlines()[1:-1]] == [
        ["update_ratio", "0", "first"],
        ["grad_norm", "0", "50%"],
    ]
    assert table.splitlines()[-1] == "... and 7 more points beyond tolerance"
    assert rest.startswith(
        "Better than the baseline (these pass):\n"
        "  dead_fraction at '1' 0.4 -> 0 at 50% (step 10) (+2 more points)\n"
        "  loss 1.5 -> 1 at 25% (step 5) (+3 more points)\n"
    )
    assert "dead_fraction" not in table and "loss" not in table
    assert check.notes[-1]["lines"][:2] == [
        "update_ratio at '0' 50x larger at first (step 0) (0.01 -> 0.5)",
        "grad_norm at '0' 30x larger at 50% (step 10) (1 -> 30)",
    ]
