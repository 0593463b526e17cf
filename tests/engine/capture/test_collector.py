"""The garbage collector is kept out of the debugger's own bookkeeping, never out of the training's code, and a
script's own choice (collection switched off) is left as it was. The observed keys a detector files are objects the
collector stops following."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import EventType, NeuralDbg
from neuraldbg.analysis.analyzer import Analyzer
from neuraldbg.analysis.tracker import Tracker
from neuraldbg.capture import collector, measure
from neuraldbg.capture.compiled import CompiledSlots
from neuraldbg.capture.gradients import GradientReader
from neuraldbg.capture.ledger import GradLedger
from neuraldbg.detectors.base import Observation


@pytest.fixture
def collecting() -> Iterator[None]:
    """Automatic collection on for the test, and as the test found it afterwards."""
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()  # a test that switched it off must not leave it off for the next


def test_a_paused_call_runs_with_collection_off_and_turns_it_back_on(collecting):
    seen: list[bool] = []

    @collector.paused
    def work(x: int) -> int:
        seen.append(gc.isenabled())
        return x + 1

    assert work(1) == 2
    assert seen == [False]
    assert gc.isenabled()


def test_a_paused_call_that_raises_turns_collection_back_on(collecting):
    @collector.paused
    def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fails()
    assert gc.isenabled()


def test_a_nested_paused_call_leaves_the_outer_one_paused(collecting):
    seen: list[bool] = []

    @collector.paused
    def inner() -> None:
        seen.append(gc.isenabled())

    @collector.paused
    def outer() -> None:
        inner()
        seen.append(gc.isenabled())

    outer()
    assert seen == [False, False]
    assert gc.isenabled()


def test_an_interrupt_raised_as_collection_is_switched_off_still_switches_it_back_on(collecting, monkeypatch):
    """A signal's exception (Ctrl-C, a test's timeout) is raised when a C call returns: here, the very switch."""
    switch = gc.disable

    def interrupted() -> None:
        switch()
        raise KeyboardInterrupt

    monkeypatch.setattr(collector, "_disable", interrupted)
    ran: list[bool] = []

    @collector.paused
    def work() -> None:
        ran.append(True)

    with pytest.raises(KeyboardInterrupt):
        work()
    assert ran == []
    assert gc.isenabled()


def test_collection_a_script_switched_off_stays_off(collecting):
    seen: list[bool] = []

    @collector.paused
    def work() -> None:
        seen.append(gc.isenabled())

    gc.disable()
    work()
    assert seen == [False]
    assert not gc.isenabled()


class Probe(nn.Module):
    """Passes its input through and notes whether automatic collection is on while the model runs."""

    def __init__(self) -> None:
        super().__init__()
        self.collecting: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.collecting.append(gc.isenabled())
        return x


#: What the debugger calls inside each of its paused entry points: a flush (the analysis), a step's commit (its
#: updates filed), an optimizer step's pre-hook and the end of the block (a step's gradients read), an optimizer
#: step's post-hook (what it stepped), a backward call's listener before the pass (a compiled forward's step filed,
#: also at the optimizer step) and after it (what the pass reached, accounted), a fully observed step's hook on the
#: loss gradient (every layer's norms) and its callback at the end of the backward pass (the raw gradient norms).
INSIDE = {
    "flush": (Analyzer, "consume"),
    "commit": (GradientReader, "file_updates"),
    "gradients": (GradientReader, "once"),
    "post-hook": (GradLedger, "after_step"),
    "before backward": (CompiledSlots, "pull"),
    "after backward": (GradLedger, "_account"),
    "loss gradient": (measure, "all_norms"),
    "backward's end": (GradientReader, "raw_norms"),
}


def _note(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[bool]:
    """``owner.name`` (a method or a module's function) replaced, for the test, by one that notes whether automatic
    collection is on at each call, then calls it; the notes."""
    noted: list[bool] = []
    original = getattr(owner, name)

    def noting(*args, **kwargs):  # type: ignore[no-untyped-def]
        noted.append(gc.isenabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, noting)
    return noted


def _train(
    steps: int, monkeypatch: pytest.MonkeyPatch, manual: bool = False
) -> tuple[Probe, dict[str, list[bool]], list[bool]]:
    """A small training run under the debugger; whether collection was on inside each of the debugger's paused
    entry points (:data:`INSIDE`), in the model's forward, and in the loop after each step."""
    inside = {where: _note(monkeypatch, owner, name) for where, (owner, name) in INSIDE.items()}
    torch.manual_seed(0)
    probe = Probe()
    model = nn.Sequential(nn.Linear(6, 8), probe, nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    after: list[bool] = []
    with NeuralDbg(model) as dbg:
        for _ in range(steps):
            x, y = torch.randn(16, 6), torch.randn(16, 1)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            if manual:
                dbg.step()
            after.append(gc.isenabled())
    assert dbg.steps == steps
    return probe, inside, after


def test_the_debugger_pauses_collection_in_its_own_work_only(collecting, monkeypatch):
    probe, inside, after = _train(20, monkeypatch)
    counts = {where: len(seen) for where, seen in inside.items()}
    assert counts["flush"] >= 17  # each fully observed step's (the first 16, and step 16), and the block's last
    assert counts["commit"] == 20 and counts["post-hook"] == 20
    assert counts["gradients"] == 21  # at each optimizer step, and at the end of the block for the step it closes
    assert counts["after backward"] == 20
    assert counts["before backward"] >= 20 and counts["loss gradient"] >= 16 and counts["backward's end"] >= 16
    assert {where: [i for i, on in enumerate(seen) if on] for where, seen in inside.items()} == {
        where: [] for where in INSIDE
    }  # each of them ran paused, every time
    assert probe.collecting == [True] * 20  # the model's forward: the training's code collects as it would
    assert after == [True] * 20
    assert gc.isenabled()


def test_steps_closed_by_hand_are_committed_paused_too(collecting, monkeypatch):
    probe, inside, after = _train(6, monkeypatch, manual=True)
    assert len(inside["commit"]) == 6 and len(inside["gradients"]) >= 6
    assert not any(on for seen in inside.values() for on in seen)
    assert probe.collecting == after == [True] * 6


def test_a_question_asked_mid_run_flushes_paused(collecting, monkeypatch):
    """``hypotheses()`` while attached flushes the cheap steps waiting in the buffer, outside any step's commit."""
    noted = _note(monkeypatch, Analyzer, "consume")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model) as dbg:
        for _ in range(40):  # a target it learns: steps 33-38 are cheap, committed into the buffer, not flushed
            x = torch.randn(16, 6)
            opt.zero_grad()
            F.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
            opt.step()
        before = len(noted)
        dbg.hypotheses()
        asked = noted[before:]
        assert gc.isenabled()
    assert asked == [False]


def test_under_a_script_that_switched_collection_off_it_stays_off(collecting, monkeypatch):
    gc.disable()
    probe, _, after = _train(5, monkeypatch)
    assert probe.collecting == [False] * 5
    assert after == [False] * 5
    assert not gc.isenabled()


def test_observed_keys_are_not_followed_by_the_collector():
    obs = Observation()
    obs.saw(EventType.GRADIENT, "fc1", "fc1.weight", call=1)
    obs.saw_each(EventType.ACTIVATION, ["fc1", "fc2"])
    gc.collect()  # a tuple of strings and ints is untracked when a collection first meets it
    assert obs.observed == [
        ("gradient", "fc1", "fc1.weight", 1),
        ("activation", "fc1", None, 0),
        ("activation", "fc2", None, 0),
    ]
    assert not any(gc.is_tracked(key) for key in obs.observed)
    # the plain string is the same key as the enum member a finding carries
    assert obs.observed[0] == (EventType.GRADIENT, "fc1", "fc1.weight", 1)
    assert hash(obs.observed[0]) == hash((EventType.GRADIENT, "fc1", "fc1.weight", 1))


def test_no_detector_files_a_key_the_collector_must_follow(monkeypatch):
    """Every detector's observed keys in a real run, the update track's included (the frozen-parameter detector
    files its own)."""
    kept: list[tuple[str, Observation]] = []
    update = Tracker.update

    def keeping(self, step, observations):  # type: ignore[no-untyped-def]
        kept.extend(observations)
        return update(self, step, observations)

    monkeypatch.setattr(Tracker, "update", keeping)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model):
        for _ in range(8):
            opt.zero_grad()
            F.mse_loss(model(torch.randn(16, 6)), torch.randn(16, 1)).backward()
            opt.step()
    gc.collect()
    tracks = {track for track, obs in kept if obs.observed}
    assert {"update", "dead"} <= tracks
    followed = [key for _, obs in kept for key in obs.observed if gc.is_tracked(key)]
    assert followed == []
