"""The speed benchmarks run and measure what they say: the peers' hand-written bound, the GPU script without a GPU,
the parts of a watched step timed inside the loop, the analysis of full steps compared across packages, and the
families of real sizes."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import math
import types

import pytest
import torch

import neuraldbg
from benchmarks import (
    against,
    cold_ops,
    collector,
    families,
    gpu,
    hook_floor,
    layer_capture,
    overhead,
    peers,
    reductions,
    smoke_file,
    smoke_steps,
    step_parts,
    targets,
)
from benchmarks.overhead import CASES
from neuraldbg.config import PRESETS


def test_the_hand_written_bound_hooks_every_leaf_once_and_takes_every_gradients_norm():
    case = next(c for c in CASES if c.build.__name__ == "tiny")
    state = case.build().state_dict()
    copy = peers.Copy(case, state, peers.Bound)
    bound = copy.monitor
    assert isinstance(bound, peers.Bound)
    copy.monitor.attach()
    assert sum(len(m._forward_hooks) for m in copy.model.modules()) == 3  # Linear, ReLU, Linear
    g = torch.Generator().manual_seed(0)
    copy.train([case.batch(g)], 1)
    want = [p.grad.norm() for p in copy.model.parameters() if p.grad is not None]
    torch.testing.assert_close(torch.stack(bound.norms), torch.stack(want))
    copy.monitor.detach()
    assert sum(len(m._forward_hooks) for m in copy.model.modules()) == 0


def test_the_checks_floor_dates_a_non_finite_gradient_at_its_step_and_keeps_the_plain_runs_losses():
    """The floor does the two every-step duties it stands for: on the tiny model, a batch with one NaN input at
    step 3 makes that step's gradients non-finite (checked with plain torch on a copy without a monitor); the
    floor dates it there, not before; and its loss curve is the plain run's, step by step."""
    case = next(c for c in CASES if c.build.__name__ == "tiny")
    state = case.build().state_dict()
    g = torch.Generator().manual_seed(0)
    batches = [case.batch(g) for _ in range(6)]
    x, y = batches[3]
    x = x.clone()
    x[0, 0] = float("nan")
    batches[3] = (x, y)
    plain = peers.Copy(case, state, peers.Monitor)
    finite_until = []
    for xb, yb in batches:
        plain.opt.zero_grad(set_to_none=True)
        loss = plain.loss(plain.model(xb), yb)
        loss.backward()
        finite_until.append(all(bool(p.grad.isfinite().all()) for p in plain.model.parameters()))
        plain.opt.step()
    assert finite_until[:3] == [True, True, True] and finite_until[3] is False
    floor = peers.Copy(case, state, peers.ChecksFloor)
    monitor = floor.monitor
    assert isinstance(monitor, peers.ChecksFloor)
    floor.train(batches, len(batches))
    assert monitor.nonfinite_steps and monitor.nonfinite_steps[0] == 3
    again = peers.Copy(case, state, peers.Monitor)
    losses = []
    for xb, yb in batches[:3]:
        again.opt.zero_grad(set_to_none=True)
        loss = again.loss(again.model(xb), yb)
        loss.backward()
        losses.append(loss.item())
        again.opt.step()
    assert monitor.losses[:3] == losses
    assert len(monitor.losses) == len(batches) and all(v != v for v in monitor.losses[3:])  # NaN from step 3 on


def test_the_first_steps_table_has_a_ratio_for_every_monitor_and_the_debuggers_attach_and_diagnosis():
    case = next(c for c in CASES if c.build.__name__ == "tiny")
    kinds = [peers.Monitor, peers.Debugger, peers.Bound, peers.ChecksFloor]
    result = peers.first(case, kinds, repeats=2, n=5)
    assert result["plain"] == 1.0
    assert result["neuraldbg"] > 0 and result["bound"] > 0 and result["checks_floor"] > 0
    assert result["attach_ms"] > 0 and result["diagnosis_ms"] > 0


def _tiny_batches() -> tuple[overhead.Case, dict[str, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    case = next(c for c in CASES if c.build.__name__ == "tiny")
    state, batches = overhead._fixture(case)
    return case, state, batches


def test_the_steady_blocks_time_what_each_step_does_and_leave_out_what_a_run_does_once(
    monkeypatch: pytest.MonkeyPatch,
):
    """A run attaches once and detaches once: a block of a few steps must carry neither (a clock that only an
    attachment moves, by 100 s, and only the removal of the hooks, by 10 s, stays out of the per-step figure); the
    commit and flush of the block's last step (1 s here) are inside it: a longer run pays them at a later step."""
    clock = [0.0]
    case, state, batches = _tiny_batches()

    def slowed(dbg: neuraldbg.NeuralDbg) -> None:
        attach, close, finish = dbg.attach, dbg.close, dbg._recorder.finish
        finished = []

        def slow_attach() -> neuraldbg.NeuralDbg:
            clock[0] += 100.0
            return attach()

        def slow_finish() -> None:
            clock[0] += 1.0 if not finished else 0.0  # close() finishes again: nothing is left to do then
            finished.append(True)
            finish()

        def slow_close() -> None:
            close()
            clock[0] += 10.0

        monkeypatch.setattr(dbg, "attach", slow_attach)
        monkeypatch.setattr(dbg, "close", slow_close)
        monkeypatch.setattr(dbg._recorder, "finish", slow_finish)

    runner = overhead.Runner(case, state, "default")
    assert runner.dbg is not None
    slowed(runner.dbg)
    monkeypatch.setattr(overhead.time, "perf_counter", lambda: clock[0])
    assert runner.run(batches, 0, 2) == pytest.approx(0.5)  # the finish, over 2 steps; not attach or close
    assert not runner.dbg.attached and runner.dbg.steps == 2
    copy = peers.Copy(case, state, peers.Debugger)
    monitor = copy.monitor
    assert isinstance(monitor, peers.Debugger)
    slowed(monitor.dbg)
    monkeypatch.setattr(peers.time, "thread_time", lambda: clock[0])
    assert copy.block(batches, 2) == pytest.approx(0.5)
    assert not monitor.dbg.attached and monitor.dbg.steps == 2


def test_the_steady_figures_time_the_presets_asked_for_and_the_first_steps_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
):
    """``benchmarks.targets`` asks for the default preset alone and measures the first steps itself: no economy or
    full copy is trained, and no fresh copies for the first steps; the overhead table keeps every preset and them."""
    made: list[str | None] = []
    real_init = overhead.Runner.__init__

    def init(self: overhead.Runner, case: overhead.Case, state: dict, preset: str | None, compiled=None) -> None:
        made.append(preset)
        real_init(self, case, state, preset, compiled)

    monkeypatch.setattr(overhead.Runner, "__init__", init)
    monkeypatch.setattr(overhead.Runner, "run", lambda self, batches, start, n, attach=True: 2.0 if self.dbg else 1.0)
    case = _tiny_batches()[0]
    result = overhead.measure(case, warmup=1, rounds=2, presets=("default",), first=False)
    assert made == [None, "default"] and result == {"default": 2.0, "plain_ms": 1000.0}
    made.clear()
    result = overhead.measure(case, warmup=1, rounds=2)
    assert made == [None, *overhead.PRESETS, None, "default", None]  # the first steps' fresh copies, after the others
    assert set(result) == {*overhead.PRESETS, "plain_ms", "first50"}


def test_the_first_steps_figure_times_one_continuous_run_of_a_fresh_debugger_against_fresh_plain_runs(
    monkeypatch: pytest.MonkeyPatch,
):
    """A smoke test's run: the watched copy trains its steps in one go from step 0, attached once (not timed) and
    closed once (timed), and is compared with the mean of two fresh plain copies trained just before and just after
    it. A stand-in clock: each plain run of the steps takes 1 s and 3 s, the watched one 4 s, its close 2 s,
    its attachment 100 s."""
    clock = [0.0]
    runs: list[tuple[str | None, overhead.Runner, int, int, bool]] = []
    attaches: list[int] = []
    closes: list[int] = []
    plain_seconds = iter([1.0, 3.0])

    def run(self: overhead.Runner, batches: list, start: int, n: int, attach: bool = True) -> float:
        watched = self.dbg is not None
        runs.append(("default" if watched else None, self, start, n, attach))
        seconds = 4.0 if watched else next(plain_seconds)
        clock[0] += seconds
        return seconds / n

    def attach(self: neuraldbg.NeuralDbg) -> neuraldbg.NeuralDbg:
        clock[0] += 100.0
        attaches.append(id(self))
        return self

    def close(self: neuraldbg.NeuralDbg) -> None:
        clock[0] += 2.0
        closes.append(id(self))

    monkeypatch.setattr(overhead.Runner, "run", run)
    monkeypatch.setattr(neuraldbg.NeuralDbg, "attach", attach)
    monkeypatch.setattr(neuraldbg.NeuralDbg, "close", close)
    monkeypatch.setattr(overhead.time, "perf_counter", lambda: clock[0])
    case, state, batches = _tiny_batches()
    assert overhead.first_steps(case, state, batches, n=20) == (4.0 + 2.0) / 2.0
    # one run of all the steps each, from step 0; the watched one attached and closed by first_steps, once
    assert [(preset, start, n, attach) for preset, _, start, n, attach in runs] == [
        (None, 0, 20, True),
        ("default", 0, 20, False),
        (None, 0, 20, True),
    ]
    assert len({id(copy) for _, copy, _, _, _ in runs}) == 3  # three fresh copies (all still held here)
    assert len(attaches) == len(closes) == 1


def test_the_collector_benchmark_counts_each_generation_and_leaves_collection_as_it_found_it(
    capsys: pytest.CaptureFixture[str],
):
    counter = collector._Counter()
    gc.callbacks.append(counter)
    try:
        gc.collect(1)
        gc.collect(2)
        gc.collect(2)
    finally:
        gc.callbacks.remove(counter)
    assert counter.collected.counts == [0, 1, 2] and counter.collected.seconds > 0
    case = next(c for c in CASES if c.build.__name__ == "deep")
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            found = collector.count(case, 6, "default")
            assert gc.isenabled() is enabled
            assert found.run_seconds > 0 and all(isinstance(n, int) and n >= 0 for n in found.counts)
    finally:
        (gc.enable if was else gc.disable)()
    assert collector.main(["--model", "tiny", "--steps", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2:4] == collector.HEADER
    assert out[4].startswith("| tiny, first 4 steps, default | ") and out[4].count("|") == 6


def test_the_hook_floor_times_each_way_and_leaves_no_hook_behind():
    from torch.nn.modules import module as module_globals

    model = next(c for c in CASES if c.build.__name__ == "tiny").build()
    table = module_globals._global_forward_hooks
    before = len(table)
    with hook_floor.WAYS["a hook per leaf module"](model):
        assert sum(len(m._forward_hooks) for m in model.modules()) == 3  # Linear, ReLU, Linear
    with hook_floor.WAYS["one global hook"](model):
        assert len(table) == before + 1
    assert sum(len(m._forward_hooks) for m in model.modules()) == 0
    assert len(table) == before
    found = hook_floor.measure("tiny", rounds=1, calls=2)
    assert set(found) == set(hook_floor.WAYS) and all(t > 0 for t in found.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: the script measures instead")
def test_the_gpu_script_says_there_is_no_gpu_and_succeeds(capsys: pytest.CaptureFixture[str]):
    assert gpu.main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


def test_the_step_parts_are_timed_inside_the_loop_and_the_timers_are_removed_after(monkeypatch: pytest.MonkeyPatch):
    # cheap steps run unhooked, whatever another test in this process compiled (after any torch.compile every pass
    # keeps the module hook, and no "unhooked passes" part would be timed)
    monkeypatch.setattr(neuraldbg.capture.hooks, "compiled_any", lambda: False)
    originals = {(cls, name): cls.__dict__[name] for _, cls, name in step_parts.PARTS}
    case = next(c for c in CASES if c.build.__name__ == "tiny")
    m = step_parts.measure(case, steps=40, warmup=20, rounds=1)
    parts = m.parts
    assert m.plain > 0 and m.watched > 0
    assert set(m.plain_phases) == set(m.watched_phases) == set(step_parts.PHASES)
    assert sum(m.plain_phases.values()) <= m.plain  # the phases lie within the step
    hook, pre = parts["forward hook (hooked passes: every module call)"], parts["optimizer pre-hook"]
    start, end = parts["the model's call begins (opens the pass)"], parts["the model's call returns (unhooked passes)"]
    assert hook > 0 and pre > 0 and start > 0 and end > 0  # the warm-up's last full steps hook, its cheap ones do not
    assert parts["    the output's cheap check"] <= parts["  end of the model's forward (either way)"] <= hook + end
    assert parts["    flush"] <= parts["  commit of the last step"]  # nested: within
    assert parts["  finite check of the gradients"] <= pre
    assert 0 < parts["    their copy, sum and read (surely_finite)"] <= parts["  finite check of the gradients"]
    assert gc.isenabled()
    step_parts.measure(case, steps=10, warmup=5, rounds=1, collector=False)
    assert gc.isenabled()  # switched back on after the blocks it was off in
    assert {(cls, name): cls.__dict__[name] for _, cls, name in step_parts.PARTS} == originals


def test_the_cold_operations_are_called_twice_in_the_optimizers_pre_hook_one_per_step_in_turn(
    monkeypatch: pytest.MonkeyPatch,
):
    calls: list[tuple[str, bool]] = []

    def op(label: str):
        def call() -> None:
            # inside the optimizer's step: its pre-hook, before any parameter moved
            calls.append((label, any(f.f_code.co_name == "wrapper" for f in _frames())))

        return call

    ops = [("a", op("a")), ("b", op("b")), ("c", op("c"))]
    monkeypatch.setattr(cold_ops, "OPS", ops)
    found = cold_ops.measure("tiny", steps=6, warmup=3)
    assert set(found) == {"a", "b", "c"} and all(f[0] > 0 and f[1] > 0 and f[2] > 0 for f in found.values())
    hooked = [label for label, inside in calls if inside]
    assert hooked == list("aabbcc" * 3)  # 9 steps: one operation per step in turn, called twice
    assert len(calls) - len(hooked) == 3 * 1100  # then each one in the hot loop: 100 untimed calls, 1000 timed


def test_the_cold_operations_table_has_a_row_per_operation_and_a_column_per_model(capsys: pytest.CaptureFixture[str]):
    assert cold_ops.main(["--model", "tiny", "--steps", "10", "--warmup", "5"]) == 0
    out = capsys.readouterr().out
    assert "tiny: first / again" in out
    assert all(f"| {label} |" in out for label, _ in cold_ops.OPS)


def test_the_step_parts_of_the_full_preset_time_full_steps_only():
    case = next(c for c in CASES if c.build.__name__ == "tiny")
    m = step_parts.measure(case, steps=20, warmup=30, rounds=1, preset="full")
    assert m.parts["  full-step gradient statistics"] > 0
    assert m.parts["      analysis of the flushed records"] > 0
    assert "  finite check of the gradients" not in m.parts  # a cheap step's: none was timed


def test_the_analysis_comparison_times_each_packages_analysis_and_refuses_different_findings():
    case = next(c for c in CASES if c.build.__name__ == "tiny")
    ms = against.analysis(case, neuraldbg, repeats=2)
    assert ms["old"] > 0 and ms["new"] > 0
    # a "revision" whose analysis finds every layer amplifying its input is not compared: its events differ
    strict = dataclasses.replace(PRESETS["full"], amplifying_gain=1e-6)  # every layer "amplifies"

    def strict_debugger(model: torch.nn.Module, preset: str) -> neuraldbg.NeuralDbg:
        assert preset == "full"
        return neuraldbg.NeuralDbg(model, config=strict)

    other = types.SimpleNamespace(NeuralDbg=strict_debugger)
    with pytest.raises(AssertionError, match="different events"):
        against.analysis(case, other, repeats=1)  # type: ignore[arg-type]  # a stand-in for a package


@pytest.mark.parametrize("case", families.CASES, ids=lambda c: c.build.__name__)
def test_every_family_trains_fully_observed_steps_under_the_debugger(case: overhead.Case):
    torch.manual_seed(0)
    model = case.build()
    x, y = case.batch(torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with neuraldbg.NeuralDbg(model, preset="full") as dbg:
        for _ in range(3):
            opt.zero_grad()
            loss = case.loss(model(x), y)
            loss.backward()
            opt.step()
    assert dbg.steps == 3 and torch.isfinite(loss)


def test_the_families_table_prints_a_row_of_ratios_per_model(capsys: pytest.CaptureFixture[str]):
    assert families.main(["--quick", "--model", "multilabel"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| multi-label")]
    assert len(rows) == 1
    cells = rows[0].strip("|").split("|")
    assert [c.strip()[-1] for c in cells[2:]] == ["x"] * 4


def test_the_smoke_steps_are_grouped_by_what_the_debugger_did_on_each():
    groups = smoke_steps.groups({0: True, 1: False, 2: True, 3: True, 4: False, 5: False})
    assert groups["fully observed"] == [0, 2, 3]
    assert groups["cheap, after a fully observed one"] == [1, 4]
    assert groups["other cheap"] == list(range(5, smoke_steps.STEPS))


def test_the_smoke_steps_read_the_fully_observed_steps_from_the_debuggers_records(capsys: pytest.CaptureFixture[str]):
    models = smoke_steps.smoke_models()
    watched = smoke_steps.run(models, "mlp", 0, watched=True)
    plain = smoke_steps.run(models, "mlp", 0, watched=False)
    assert watched.debugger is not None and plain.debugger is None and not plain.fixed and not plain.full
    assert len(watched.steps) == len(plain.steps) == smoke_steps.STEPS == watched.debugger.steps
    assert sorted(watched.full) == list(range(smoke_steps.STEPS))  # every step analysed once
    assert sum(watched.full.values()) == watched.debugger._analyzer.full_steps > 0
    assert all(watched.full[step] for step in range(16))  # the dense start: every step fully observed
    assert set(watched.fixed) == set(smoke_steps.FIXED) and all(ns > 0 for ns in watched.fixed.values())
    for run in (watched, plain):  # each step timed phase by phase, the step their sum
        assert [len(p) for p in run.phases] == [len(smoke_steps.PHASES)] * smoke_steps.STEPS
        assert [sum(p) for p in run.phases] == run.steps
    threads = torch.get_num_threads()
    assert smoke_steps.main(["--runs", "1", "--model", "mlp"]) == 0
    assert torch.get_num_threads() == threads
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    table = rows[: rows.index(next(r for r in rows if r.startswith("| mlp: added ms")))]
    assert [row.split("|")[1].strip() for row in table[1:]] == [
        "fully observed",
        "cheap, after a fully observed one",
        "other cheap",
        *smoke_steps.FIXED,
        "the whole run",
    ]
    assert table[-1].split("|")[2].strip() == str(smoke_steps.STEPS)
    phases = rows[len(table) :]
    assert phases[0].split("|")[2:-1] == [f" {name} " for name in smoke_steps.PHASES]
    assert [row.split("|")[1].strip() for row in phases[1:]] == [
        "fully observed",
        "cheap, after a fully observed one",
        "other cheap",
    ]


def test_the_smoke_steps_count_what_a_run_does_exactly_and_where_the_debugger_was_entered(
    capsys: pytest.CaptureFixture[str],
):
    counted = smoke_steps.count("mlp")
    plain_calls, watched_calls = counted.calls
    plain_ops, watched_ops = counted.ops
    assert 0 < plain_calls < watched_calls and 0 < plain_ops < watched_ops
    assert 0 < counted.functions[0] < plain_calls and counted.functions[0] < counted.functions[1] < watched_calls
    # exact: counted again, the same figures
    again = smoke_steps.count("mlp")
    assert again == counted
    entries = counted.entries
    # the debugger's calls are attributed to where it was entered: the analysis of committed steps, the layers'
    # hook, the optimizer's hook, the wrappers' own work; the training's own calls to none
    assert {"analysis", "capture.forward.on_module_output", "capture.backward.on_optimizer_step"} <= set(entries)
    assert entries[smoke_steps.WRAPPERS] > 0
    assert not any(where.startswith(("torch", "benchmarks")) for where in entries)
    added = watched_calls - plain_calls
    assert 0.8 * added < sum(entries.values()) <= added + plain_calls // 10
    lines = smoke_steps.count_table("mlp", counted, top=3)
    assert lines[2] == f"| Python calls | {plain_calls:,} | {watched_calls:,} | {watched_calls - plain_calls:,} |"
    plain_py, watched_py = counted.functions
    assert lines[3] == (
        f"| ... of functions written in Python | {plain_py:,} | {watched_py:,} | {watched_py - plain_py:,} |"
    )
    assert lines[4] == f"| aten operations | {plain_ops:,} | {watched_ops:,} | {watched_ops - plain_ops:,} |"
    shown = [line.split("|")[1].strip() for line in lines[8:]]
    assert shown == [where for where, _ in entries.most_common(3)] + ["elsewhere"]
    assert smoke_steps.main(["--count", "--model", "mlp"]) == 0
    assert "| Python calls |" in capsys.readouterr().out


def test_the_smoke_steps_split_the_added_time_at_the_debuggers_entry_points_and_put_them_back(
    capsys: pytest.CaptureFixture[str],
):
    """--inside times each outermost call of the debugger's entry points: every one of them exists (a rename in the
    engine fails here rather than timing nothing), a watched step spends time in them and a plain one none, and the
    classes get their own methods back when the block closes."""
    originals = {}
    for module, name, methods in smoke_steps.ENTRIES:
        cls = getattr(importlib.import_module(module), name)
        for method in methods:
            originals[(cls, method)] = cls.__dict__[method]
    models = smoke_steps.smoke_models()
    total = [0]
    with smoke_steps.timed_entries(total):
        assert all(cls.__dict__[method] is not f for (cls, method), f in originals.items())
        watched = smoke_steps.run(models, "mlp", 0, True, total)
        plain = smoke_steps.run(models, "mlp", 0, False, total)
    assert all(cls.__dict__[method] is f for (cls, method), f in originals.items())
    assert len(watched.inside) == smoke_steps.STEPS and all(ns > 0 for ns in watched.inside)
    assert plain.inside == [0] * smoke_steps.STEPS
    # outermost calls only: inside the entries is less than the steps themselves, step by step
    assert all(i < s for i, s in zip(watched.inside, watched.steps, strict=True))
    # a debugger made after the block is not timed
    after = [0]
    smoke_steps.run(models, "mlp", 0, True, after)
    assert after == [0]
    groups = smoke_steps.groups({0: True})
    m = smoke_steps.Measured(
        [1.0] * smoke_steps.STEPS, [0.4] * smoke_steps.STEPS, [], {}, groups, True, [0.3] * smoke_steps.STEPS
    )
    rows = {row.split("|")[1].strip(): row.split("|")[2:-1] for row in smoke_steps.inside_table("x", m)[2:]}
    assert [v.strip() for v in rows["fully observed"]] == ["0.400", "0.300", "0.100", "25%"]
    assert smoke_steps.main(["--runs", "1", "--model", "mlp", "--inside"]) == 0
    assert "| mlp: an average step of | added ms | inside the debugger |" in capsys.readouterr().out


class _Entered:
    """Two entry points, one calling the other (as the debugger's model-call start commits and analyses a step)."""

    def outer(self) -> None:
        self.inner()

    def inner(self) -> None:
        pass


def test_the_smoke_steps_count_a_call_made_inside_another_entry_point_once(monkeypatch: pytest.MonkeyPatch):
    ticks = iter(range(0, 1000, 10))  # each reading of the clock 10 ns after the last
    monkeypatch.setattr(smoke_steps, "ENTRIES", ((__name__, "_Entered", ("outer", "inner")),))
    monkeypatch.setattr(smoke_steps.time, "perf_counter_ns", lambda: next(ticks))
    total = [0]
    with smoke_steps.timed_entries(total):
        _Entered().outer()  # outer's clock reads 0, inner's none, outer's end 10
        _Entered().inner()  # 10 more
    monkeypatch.undo()
    assert total == [20]
    assert "outer" in vars(_Entered) and vars(_Entered)["outer"].__name__ == "outer"  # put back


def test_the_smoke_steps_phase_table_averages_each_groups_steps_phase_by_phase():
    n = len(smoke_steps.PHASES)
    added_phases = [[float(step) if k == 1 else 0.0 for k in range(n)] for step in range(smoke_steps.STEPS)]
    groups = smoke_steps.groups({0: True, 2: True})  # full: 0 and 2; after one: 1 and 3; the rest cheap
    m = smoke_steps.Measured([0.1] * smoke_steps.STEPS, [0.0] * smoke_steps.STEPS, added_phases, {}, groups, True)
    rows = {row.split("|")[1].strip(): row.split("|")[2:-1] for row in smoke_steps.phase_table("x", m)[2:]}
    assert [float(v) for v in rows["fully observed"]] == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # steps 0 and 2
    assert float(rows["cheap, after a fully observed one"][1]) == 2.0  # steps 1 and 3
    assert float(rows["other cheap"][1]) == sum(range(4, smoke_steps.STEPS)) / (smoke_steps.STEPS - 4)


def test_the_smoke_files_times_are_read_per_test_and_the_first_test_is_split_from_the_rest():
    """The conftest's times file gives each test's CPU time and the loop's; the first test's extra (what the process
    pays once) is told apart from the later tests' ratio, on made-up figures."""
    loop, failed, tests = smoke_file.read_times("test 1.5\ntest 0.25\ntest 0.5\nloop 2.3 0\n")
    assert (loop, failed, tests) == (2.3, 0, [1.5, 0.25, 0.5])
    assert smoke_file.read_times("test 0.1\nloop 0.1 2\n")[1] == 2
    with pytest.raises(ValueError, match="no loop line"):
        smoke_file.read_times("test 0.1\n")
    first, rest = smoke_file.first_and_rest([1.5, 0.25, 0.5], [1.0, 0.125, 0.25])
    assert first == 0.5 and rest == 2.0
    with pytest.raises(ValueError, match="as many"):
        smoke_file.first_and_rest([1.0, 2.0], [1.0])


def test_the_smoke_files_conftest_writes_a_line_per_test_then_the_loop(
    pytester: pytest.Pytester, tmp_path, monkeypatch: pytest.MonkeyPatch
):
    """The conftest the benchmark writes, run on two passing tests: a ``test`` line for each, then the loop's."""
    times = tmp_path / "times.txt"
    pytester.makeconftest(smoke_file.CONFTEST)
    pytester.makepyfile("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    monkeypatch.setenv("SMOKE_TIMES", str(times))
    pytester.runpytest_inprocess("-p", "no:neuraldbg").assert_outcomes(passed=2)
    loop, failed, tests = smoke_file.read_times(times.read_text())
    assert failed == 0 and len(tests) == 2 and loop >= 0 and all(t >= 0 for t in tests)


def test_the_smoke_file_measures_both_files_in_alternating_rounds_after_an_untimed_run_of_each(
    monkeypatch: pytest.MonkeyPatch,
):
    """Each round's ratios are the watched file's over the plain file's of the same round; the order alternates;
    one untimed run of each fills the bytecode cache first (not with ``cold``), and only the timed ones count."""
    calls: list[tuple[str, bool]] = []

    def fake(folder, name, cold=False):
        calls.append((name, cold))
        if name == "test_smoke_watched.py":
            return smoke_file.FileRun(3.0, 5.0, [1.25, 1.0, 1.0])
        return smoke_file.FileRun(2.0, 4.0, [1.0, 0.5, 0.5])

    monkeypatch.setattr(smoke_file, "run_file", fake)
    found = smoke_file.measure(2)
    plain, watched = "test_smoke_plain.py", "test_smoke_watched.py"
    assert calls == [
        (plain, False),
        (watched, False),
        (plain, False),
        (watched, False),
        (watched, False),
        (plain, False),
    ]
    assert found.loops == [1.5, 1.5] and found.processes == [1.25, 1.25] and found.plain_loop == [2.0, 2.0]
    assert found.rests == [2.0, 2.0] and found.firsts == [0.25, 0.25]
    calls.clear()
    smoke_file.measure(1, cold=True)
    assert calls == [(plain, True), (watched, True)]  # no untimed run without the cache to fill


def test_the_targets_are_each_measured_once_and_judged_against_the_issues_bounds():
    asked: list[str] = []

    def steady(name):
        asked.append("steady " + name)
        return {"default": 1.14 if name == "tiny" else 1.06}

    def first(name):
        asked.append("first " + name)
        return {"tiny": [3.0, 2.9, 3.2], "many": [1.3, 1.25, 1.2]}.get(name, [1.3, 1.2, 1.1])

    def compiled(name):
        asked.append("compiled " + name)
        return {
            **{"compiled": 1.05, "compiled_low": 1.0, "compiled_high": 1.2},
            **{"original": 1.12, "original_low": 1.01, "original_high": 1.3},
            **{"graph_breaks": 0, "recompiles": 1 if name == "mlp" else 0},
        }

    figures = smoke_file.Figures([1.4, 1.2, 1.25], [1.1] * 3, [1.6] * 3, [2.0] * 3, [0.05] * 3)
    rows = targets.targets(steady, first, compiled, lambda: figures)
    models = [step for name in targets.MODELS for step in (f"first {name}", f"steady {name}")]
    assert asked == [*models, "compiled mlp", "compiled transformer", "first many"]
    got = {t.what: (t.bound, t.measured, t.met) for t in rows}
    assert len(got) == len(rows) == 2 * len(targets.MODELS) + 3 * len(targets.COMPILED_MODELS) + 2
    assert got["tiny: first 50 steps"] == (1.25, 3.0, False)  # the median of the runs
    assert got["tiny: steady state"] == (1.15, 1.14, True)  # the tiny model's own bound
    assert got["mlp: first 50 steps"] == (1.25, 1.2, True)
    assert got["mlp: steady state"] == (1.05, 1.06, False)
    assert got["mlp, compiled, debugger on the compiled module"] == (1.10, 1.05, True)
    assert got["transformer, compiled, debugger on the original module"] == (1.10, 1.12, False)
    assert got["mlp, compiled: graph breaks and new graphs"] == (0, 1, False)
    assert got["transformer, compiled: graph breaks and new graphs"] == (0, 0, True)
    assert got["5,000 parameter tensors: first 64 steps"] == (1.25, 1.25, True)  # at the bound: met
    assert got["the smoke file's 10 tests"] == (1.30, 1.25, True)
    lines = targets.table(rows)
    assert "| tiny: first 50 steps | 1.25x | 3.000x | 2.90-3.20x | no |" in lines
    assert "| the smoke file's 10 tests | 1.30x | 1.250x | 1.20-1.40x | yes |" in lines
    assert "| mlp, compiled: graph breaks and new graphs | 0 | 1 | - | no |" in lines
    assert "| mlp: steady state | 1.05x | 1.060x | - | no |" in lines
    assert lines[-1] == f"{sum(t.met for t in rows)} of {len(rows)} targets met."


class _Log(torch.nn.Module):
    """``torch.log``, noting per call whether a global module hook is in torch's table (a hooked pass)."""

    def __init__(self) -> None:
        super().__init__()
        self.hooked: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.hooked.append(bool(torch.nn.modules.module._global_forward_hooks))
        return torch.log(x)


def _traced_layer(monkeypatch: pytest.MonkeyPatch, without: bool) -> str | None:
    """The layer a non-finite output begun in ``log`` at a cheap step 40 is blamed on, with the layers' outputs
    kept as the product keeps them or left out the way the benchmark leaves them out."""
    monkeypatch.setattr(layer_capture.hooks, "compiled_any", lambda: False)  # cheap steps run unhooked

    def build() -> torch.nn.Sequential:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Linear(16, 16), _Log(), torch.nn.Linear(16, 1))
        with torch.no_grad():
            model[1].bias.fill_(5.0)  # log's input positive on ordinary batches
        return model

    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(32, 10, generator=g), torch.randn(32, 1, generator=g)) for _ in range(50)]
    batches[40] = (batches[40][0] * 1e4, batches[40][1])  # one batch of raw values at step 40
    plain = build()  # ground truth, plain torch: log is first given values it cannot take at step 40
    opt = torch.optim.SGD(plain.parameters(), lr=1e-4)
    for i, (x, y) in enumerate(batches[:41]):
        h = plain[1](plain[0](x))
        assert torch.isfinite(h).all() and torch.isfinite(torch.log(h)).all() == (i < 40)
        opt.zero_grad()
        torch.nn.functional.mse_loss(plain(x), y).backward()
        opt.step()
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    leave_out = layer_capture.without_capture() if without else contextlib.nullcontext()
    with leave_out, neuraldbg.NeuralDbg(model) as dbg:
        for x, y in batches:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    assert torch.nn.Module.__call__ is torch.nn.Module._wrapped_call_impl  # the wrapper put back either way
    assert model[2].hooked[40] is False  # a cheap step, run without the module hook
    found = [e for e in dbg.events if e.kind is neuraldbg.FailureKind.NON_FINITE and e.step_start == 40]
    assert found, "the non-finite output is dated at its step either way"
    return found[0].layer


def test_the_layer_capture_benchmark_leaves_out_exactly_what_traces_a_cheap_steps_non_finite_output_to_its_layer(
    monkeypatch: pytest.MonkeyPatch,
):
    assert _traced_layer(monkeypatch, without=False) == "2"  # the log layer, as the product finds it
    kept = layer_capture.hooks._watched_call
    assert _traced_layer(monkeypatch, without=True) == ""  # the model's output, no layer: what the third copy skips
    assert layer_capture.hooks._watched_call is kept


def test_the_layer_capture_table_has_a_row_per_model_with_both_watched_copies(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    m = layer_capture.measure(next(c for c in CASES if c.build.__name__ == "tiny"), warmup=10, rounds=3)
    assert set(m) == {"as is", "without", "plain_step", "share_low", "share_high"}
    assert m["as is"] > 0 and m["without"] > 0 and m["plain_step"] > 0 and m["share_low"] <= m["share_high"]
    assert layer_capture.layer_calls(next(c for c in CASES if c.build.__name__ == "tiny")) == 4  # the model, 3 layers
    assert layer_capture.main(["--model", "tiny", "--rounds", "2", "--warmup", "5"]) == 0
    out = capsys.readouterr().out
    assert "| tiny | 4 |" in out and "keeping no layer output" in out and "benchmarks.overhead's blocks" in out
    measured = layer_capture.measure
    blocks: list[int] = []

    def spy(case: overhead.Case, warmup: int, rounds: int) -> dict[str, float]:
        blocks.append(case.block)
        return measured(case, warmup, rounds)

    monkeypatch.setattr(layer_capture, "measure", spy)
    assert layer_capture.main(["--model", "tiny", "--rounds", "2", "--warmup", "5", "--block", "3"]) == 0
    assert "blocks of 3 steps" in capsys.readouterr().out and blocks == [3]


def _frames() -> list[types.FrameType]:
    """The caller's stack, innermost first."""
    import sys

    frame, out = sys._getframe(1), []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out


def test_the_reductions_table_times_both_ways_of_every_reading_and_finds_the_same_answers(
    capsys: pytest.CaptureFixture[str],
):
    rows = reductions.measure(scale=8, rounds=2, calls=1)
    assert len(rows) == len(reductions.cases(scale=8))
    assert all(row.equal for row in rows)  # the debugger's way gives torch's answer (bit for bit where exact)
    assert all(row.torch_s > 0 and row.ours_s > 0 for row in rows)
    inexact = [row for row in rows if not row.case.exact]
    assert inexact and all(0 < row.difference < 1e-4 for row in inexact)  # the L1 norm: another order of summing
    text = reductions.table(rows)
    assert text.count("\n") == len(rows) + 1 and "NO" not in text


def test_the_reductions_comparison_tells_a_different_answer():
    assert reductions.compare(torch.tensor([1.0, math.nan]), torch.tensor([1.0, math.nan]), exact=True) == (True, 0.0)
    assert not reductions.compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, math.nan]), exact=True)[0]
    assert not reductions.compare(torch.tensor(1.0), torch.tensor(1.0 + 1e-6), exact=True)[0]
    assert reductions.compare(torch.tensor(1.0), torch.tensor(1.0 + 1e-6), exact=False)[0]
    assert not reductions.compare(torch.tensor([True]), torch.tensor([False]), exact=True)[0]
