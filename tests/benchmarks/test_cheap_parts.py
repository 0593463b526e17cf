"""The cheap-step parts benchmark switches off what each part names, for its counted steps only, and puts it back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from benchmarks import cheap_parts, instructions
from benchmarks.overhead import BY_NAME, Runner, _fixture
from neuraldbg.capture import hooks
from neuraldbg.capture.forward import ForwardPath
from neuraldbg.capture.gradients import GradientReader
from neuraldbg.capture.ledger import GradLedger

#: The functions each part's switch-off must keep from running on a cheap step.
_CALLED = {
    "backward listener (the loss, the .grad ledger)": [(GradLedger, "before_step"), (GradLedger, "after_step")],
    "gradients' finite check": [(GradientReader, "check_finite")],
    "head gradient probe": [(GradientReader, "read_head")],
    "samples' fingerprints": [(ForwardPath, "_fingerprint")],
    "output's check": [(ForwardPath, "_check_ends")],
    "layer outputs kept": [],
}


def _state() -> tuple[list[Any], list[Any], dict[int, Any]]:
    functions = [owner.__dict__[name] for calls in _CALLED.values() for owner, name in calls]
    return functions, list(hooks._backward_listeners), {k: list(v) for k, v in hooks._layers.items()}


def test_every_part_is_named_with_what_it_switches_off() -> None:
    assert set(cheap_parts.PARTS) == set(_CALLED)


@pytest.mark.parametrize("part", list(cheap_parts.PARTS))
def test_a_part_switched_off_does_not_run_on_a_cheap_step_and_is_back_afterwards(
    part: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = BY_NAME["tiny"]
    state, batches = _fixture(case)
    copy = Runner(case, state, "default")
    assert copy.dbg is not None
    copy.dbg.attach()
    copy.run(batches, 0, 258, attach=False)  # the full step at 256 and the one after it: cheap steps next
    calls: dict[str, int] = {}
    for owner, name in _CALLED[part]:
        original = owner.__dict__[name]

        def spy(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] = calls.get(_name, 0) + 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)
    before = _state()
    assert hooks._backward_listeners and hooks._layers  # what two of the parts empty is there to begin with
    with cheap_parts.PARTS[part]():
        copy.run(batches, 258, 3, attach=False)
        if part == "backward listener (the loss, the .grad ledger)":
            assert not hooks._backward_listeners
        if part == "layer outputs kept":
            assert not hooks._layers
        assert calls == {}, f"{part}: ran while switched off"
    assert _state() == before  # everything back as it was
    copy.run(batches, 261, 3, attach=False)
    assert all(calls.get(name) == 3 for _, name in _CALLED[part]), calls  # and running again
    copy.dbg.close()


class _Spy:
    """A counter that notes, per part, the steps trained inside it and which functions were switched off."""

    def __init__(self, made: list[Runner]) -> None:
        self.made = made
        self.parts: dict[str, tuple[bool, int, list[Any]]] = {}
        self.reference = _state()

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        before = sum(r.steps for r in self.made)
        changed = [
            i for i, (now, then) in enumerate(zip(_state()[0], self.reference[0], strict=True)) if now is not then
        ]
        attached = torch.nn.Module.__call__ is not torch.nn.Module._wrapped_call_impl
        empty = attached and (not hooks._backward_listeners or not hooks._layers)  # an attached debugger has both
        yield
        assert name not in self.parts, f"part {name!r} counted twice"
        self.parts[name] = (
            attached,
            sum(r.steps for r in self.made) - before,
            [*changed, *(["emptied"] if empty else [])],
        )


def test_each_copy_counts_the_cheap_steps_with_its_own_part_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    case = BY_NAME["tiny"]
    state, batches = _fixture(case)
    made: list[Runner] = []

    class Noted(Runner):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(cheap_parts, "Runner", Noted)
    monkeypatch.setattr(case, "first", 4)
    spy = _Spy(made)
    cheap_parts.count_cheap(case, state, batches, 6, 256, spy)  # type: ignore[arg-type]
    names = list(cheap_parts.PARTS)
    assert list(spy.parts) == ["empty", "plain", "watched", *(f"off{i}" for i in range(len(names)))]
    assert spy.parts["empty"] == (False, 0, [])
    assert spy.parts["plain"] == (False, 4, [])  # no debugger attached, nothing switched off
    assert spy.parts["watched"] == (True, 4, [])
    functions = [(owner, name) for calls in _CALLED.values() for owner, name in calls]
    for i, part in enumerate(names):
        attached, steps, changed = spy.parts[f"off{i}"]
        expected = [functions.index(call) for call in _CALLED[part]]
        if part in ("backward listener (the loss, the .grad ledger)", "layer outputs kept"):
            expected.append("emptied")
        assert (attached, steps, changed) == (True, 4, expected), part
    assert torch.nn.Module.__call__ is torch.nn.Module._wrapped_call_impl  # every debugger closed after
    assert _state() == spy.reference


def test_the_table_gives_each_parts_cost_a_cheap_step() -> None:
    counts = {"plain": 62_000_000, "watched": 86_800_000, "off0": 80_600_000, "off1": 86_800_000}
    lines = cheap_parts.table("tiny", counts, 62, ["listener", "nothing"])
    assert lines[0] == "tiny: a plain step 1.000M instructions, a cheap step adds +0.400M"
    assert lines[4] == "| listener | 0.1000M | +0.3000M |"
    assert lines[5] == "| nothing | 0.0000M | +0.4000M |"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "huge"], "--model 'huge': expected one of"),
        (["--steps", "2"], "--steps 2: expected at least 3"),
        (["--warmup", "300"], "--warmup 300: expected a multiple of 64"),
    ],
)
def test_a_bad_option_is_refused_by_value(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cheap_parts.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_tool_is_named_and_the_benchmark_exits_with_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(instructions.shutil, "which", lambda name: None if name == "valgrind" else "/bin/x")
    assert cheap_parts.main([]) == 2
    assert "benchmarks.cheap_parts: valgrind not found" in capsys.readouterr().err
