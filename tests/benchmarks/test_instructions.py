"""The instruction-count benchmark counts what it says: each part inside its own dump, the plain copy with no
debugger attached, and its files read and its tools checked with a clear message."""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from benchmarks import instructions
from benchmarks.overhead import BY_NAME, Runner, _fixture

_DUMP = """version: 1
creator: callgrind-3.22.0
pid: 4242
cmd:  python -m benchmarks.instructions --child tiny
part: 2

desc: I1 cache:
desc: Timerange: Basic block 1 - 2
desc: Trigger: dump {name}

positions: line
events: Ir
summary: {count}

fl=(1) ???
fn=(1) main
0 12
"""


def test_a_dump_gives_the_part_it_was_asked_for_and_its_count(tmp_path: Path):
    (tmp_path / "cg.4242.1").write_text(_DUMP.format(name="plain_steady", count=123456))
    (tmp_path / "cg.4242.2").write_text(_DUMP.format(name="watched_steady", count=234567))
    (tmp_path / "cg.4242").write_text(_DUMP.replace("dump {name}", "Program termination").format(count=9))
    assert instructions.read_dumps(tmp_path) == {"plain_steady": 123456, "watched_steady": 234567}


def test_what_the_counting_itself_costs_is_taken_from_every_part():
    counts = {"empty": 140, "plain_full": 2_000_140, "watched_first": 5_000_140}
    assert instructions.net(counts) == {"plain_full": 2_000_000, "watched_first": 5_000_000}


def test_a_dump_without_its_summary_is_an_error_naming_the_part():
    text = _DUMP.format(name="watched_first", count=1).replace("summary: 1\n", "")
    with pytest.raises(ValueError, match=r"'watched_first'.*summary"):
        instructions.read_dump(text)


def test_a_missing_tool_is_named_and_the_benchmark_exits_with_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setattr(instructions.shutil, "which", lambda name: None if name == "callgrind_control" else "/bin/x")
    with pytest.raises(instructions.Missing, match=r"^callgrind_control not found"):
        instructions.tools()
    assert instructions.main(["--model", "tiny"]) == 2
    assert "callgrind_control not found on PATH" in capsys.readouterr().err


def test_an_unknown_model_is_refused_by_name(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        instructions.main(["--model", "huge"])
    assert "--model 'huge'" in capsys.readouterr().err


def test_the_counted_process_runs_the_child_under_callgrind_with_counting_off_at_start(tmp_path: Path):
    argv = instructions.command("/usr/bin/valgrind", tmp_path, "deep", 64, 320, "abc123")
    assert argv[:3] == ["/usr/bin/valgrind", "--tool=callgrind", "--instr-atstart=no"]
    assert argv[3] == f"--callgrind-out-file={tmp_path}/cg.%p"
    child = argv[argv.index("-m") + 1 :]
    against = ["--against", "abc123"]
    assert child == ["benchmarks.instructions", "--child", "deep", "--steps", "64", "--warmup", "320", *against]


def test_a_part_is_counted_from_zero_and_dumped_under_its_name_even_when_it_fails():
    calls: list[list[str]] = []
    counter = instructions.Counter("callgrind_control", run=calls.append)
    with pytest.raises(RuntimeError), counter.part("watched_first"):
        raise RuntimeError("the training failed")
    pid = calls[0][-1]
    assert calls == [
        ["callgrind_control", "--instr=on", pid],
        ["callgrind_control", "--zero", pid],
        ["callgrind_control", "--dump=watched_first", pid],
        ["callgrind_control", "--instr=off", pid],
    ]


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_part_starts_with_the_garbage_of_what_ran_before_collected():
    cycle = _Cycle()
    ref = weakref.ref(cycle)
    del cycle  # garbage only a collection frees
    alive_when_counting_began: list[bool] = []

    def run(argv: list[str]) -> None:
        if argv[1] == "--instr=on":
            alive_when_counting_began.append(ref() is not None)

    with instructions.Counter("callgrind_control", run=run).part("plain_cheap"):
        pass
    assert alive_when_counting_began == [False]


class _Spy:
    """A counter that notes, for each part, whether a debugger was attached and the steps trained inside it."""

    def __init__(self, copies: list[Runner]) -> None:
        self.copies = copies
        self.parts: dict[str, tuple[bool, int]] = {}

    @contextmanager
    def part(self, name: str):
        before = sum(c.steps for c in self.copies)
        attached_before = torch.nn.Module.__call__ is not torch.nn.Module._wrapped_call_impl
        yield
        attached = attached_before or torch.nn.Module.__call__ is not torch.nn.Module._wrapped_call_impl
        assert name not in self.parts, f"part {name!r} counted twice"
        self.parts[name] = (attached, sum(c.steps for c in self.copies) - before)


def test_each_part_counts_its_own_copys_steps_and_the_plain_ones_run_with_no_debugger_attached(
    monkeypatch: pytest.MonkeyPatch,
):
    case = BY_NAME["tiny"]
    state, batches = _fixture(case)
    made: list[Runner] = []

    class Noted(Runner):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(instructions, "Runner", Noted)
    monkeypatch.setattr(case, "first", 4)
    spy = _Spy(made)
    full = instructions.count_parts(case, state, batches, 5, 256, {"watched": Noted}, spy)  # type: ignore[arg-type]
    assert list(spy.parts) == [
        "empty",
        "plain_full",
        "plain_cheap",
        "watched_full",
        "watched_cheap",
        "plain_first",
        "attach",
        "watched_first",
    ]
    # a debugger left attached would make the plain copy pay for it
    assert spy.parts["plain_full"] == (False, 2) and spy.parts["plain_cheap"] == (False, 3)
    assert spy.parts["watched_full"] == (True, 2) and spy.parts["watched_cheap"] == (True, 3)
    assert spy.parts["empty"] == (False, 0)
    assert spy.parts["plain_first"] == (False, 4)
    assert spy.parts["attach"] == (True, 0)
    assert spy.parts["watched_first"] == (True, 4)
    assert full == {"watched": 1}  # step 256 of 256-260: the full step the steady parts begin with
    assert torch.nn.Module.__call__ is torch.nn.Module._wrapped_call_impl  # every debugger closed after
    watched = [r for r in made if r.dbg is not None]
    assert len(watched) == 3 and all(r.dbg.steps == r.steps for r in watched)  # every watched step observed


def test_the_table_prints_what_each_step_adds_and_the_ratios():
    counts = {
        "plain_full": 2_000_000,
        "plain_cheap": 62_000_000,
        "watched_full": 12_000_000,
        "watched_cheap": 93_000_000,
        "plain_first": 50_000_000,
        "watched_first": 125_000_000,
        "attach": 1_300_000,
        "base_full": 22_000_000,
        "base_cheap": 106_000_000,
    }
    lines = instructions.table([("tiny", counts, {"watched": 1, "base": 2}, 64, 50)], against="abc")
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells == [
        "tiny",
        "1.000M",  # plain: 64M over 64 steps
        "+0.500M",  # a cheap step: 31M more over 62
        "+10.000M",  # the full step and the next
        "1.641x (1)",  # (12 + 93) / 64
        "+0.710M",
        "+20.000M",
        "2.000x (2)",
        "1.000M",
        "2.500x",
        "-",  # the base's first steps not counted
        "1.3M",
    ]


def test_the_steady_warmup_must_end_where_a_full_step_comes(capsys: pytest.CaptureFixture[str]):
    for argv in (["--warmup", "300"], ["--warmup", "128"], ["--steps", "2"]):
        with pytest.raises(SystemExit):
            instructions.main(argv)
        assert argv[1] in capsys.readouterr().err
