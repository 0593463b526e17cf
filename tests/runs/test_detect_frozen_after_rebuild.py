"""An optimizer rebuilt mid-run over part of the model leaves the rest frozen: a new phase of the schedule built as
``SGD(model[2:].parameters())`` where ``model.parameters()`` was meant. The backbone's old optimizer never steps
again, its gradients keep coming and, zeroed by nobody, build up. Ground truth by plain torch: the backbone does not
move after the rebuild, its gradient grows far beyond one step's, and the model ends below its fixed twin.

Healthy twins stay silent: the fixed twin; a head fine-tuned alone after training everything, with the backbone
frozen on purpose (``requires_grad=False``, or run under ``no_grad``); a backbone whose own optimizer steps every 8th
batch on gradients accumulated in between; a backbone whose optimizer steps on turns while the head's steps every
batch (its last turn ending 250 steps before the end, or a turn sat out for half the run). A backbone left behind whose
gradient ``model.zero_grad()`` clears every step is not this rule either: nothing builds up to say it was a mistake.
A backbone left out of the only optimizer from the start stays frozen as before (no optimizer of the run stepped it).
Each twin's verdict was checked to turn into a false alarm without the guard it tests (the share of the run, the
undoing by a later move, the build-up against the stepped parameters)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.events import SemanticEvent

STEPS = 600
REBUILD = 40
make = support.classification_batches((16,), 4, batch=32, seed=3)
HELD_OUT = support.classification_batches((16,), 4, batch=4000, seed=3)(10_000)  # the same teacher

#: What a program does at each step: (model, the optimizers so far, step) -> the optimizers that step now.
Program = Callable[[nn.Sequential, dict[str, torch.optim.Optimizer], int], list[torch.optim.Optimizer]]


def rebuilt(over: str) -> Program:
    """Phase 2 at REBUILD: a new optimizer at half the learning rate, over every parameter or over the head alone."""

    def program(model: nn.Sequential, opts: dict[str, torch.optim.Optimizer], step: int) -> list[torch.optim.Optimizer]:
        if step == REBUILD:
            params = model.parameters() if over == "all" else model[2:].parameters()
            opts["main"] = torch.optim.SGD(params, lr=0.025, momentum=0.9)
        return [opts["main"]]

    return program


def run(
    program: Program, watched: bool, backbone_grad: str = "on"
) -> tuple[float, float, list[float], NeuralDbg | None]:
    """Held-out accuracy, how far the backbone's weight moved after REBUILD, and its gradient norm at each step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 6), nn.ReLU(), nn.Linear(6, 4))
    opts: dict[str, torch.optim.Optimizer] = {"main": torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)}
    grads: list[float] = []
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.__enter__()
    for step in range(STEPS):
        stepping = program(model, opts, step)
        if step == REBUILD:
            at_rebuild = model[0].weight.detach().clone()
            if backbone_grad == "requires_grad":  # frozen on purpose: the fine-tuning phase trains the head alone
                model[:2].requires_grad_(False)
        x, y = make(step)
        if backbone_grad == "no_grad" and step >= REBUILD:
            with torch.no_grad():
                features = model[:2](x)
            out = model[2:](features)
        else:
            out = model(x)
        F.cross_entropy(out, y).backward()
        g = model[0].weight.grad
        grads.append(0.0 if g is None else float(g.norm()))
        for opt in stepping:  # each optimizer zeroes the gradients it applied
            opt.step()
            opt.zero_grad()
        if backbone_grad == "zeroed":  # model.zero_grad(): every gradient, in the optimizer or not
            model.zero_grad()
    if dbg is not None:
        dbg.__exit__(None, None, None)
    moved = float((model[0].weight.detach() - at_rebuild).norm())
    with torch.no_grad():
        accuracy = float((model(HELD_OUT[0]).argmax(1) == HELD_OUT[1]).float().mean())
    return accuracy, moved, grads, dbg


def frozen(dbg: NeuralDbg | None) -> list[SemanticEvent]:
    assert dbg is not None
    return [e for e in dbg.events if e.kind is FailureKind.FROZEN_PARAMETERS]


def test_an_optimizer_rebuilt_over_the_head_leaves_the_backbone_frozen() -> None:
    twin, twin_moved, _, twin_dbg = run(rebuilt("all"), watched=True)
    accuracy, moved, grads, _ = run(rebuilt("head"), watched=False)
    # plain torch: after the rebuild the backbone never moves again while its gradient, zeroed by nobody, builds up
    # far beyond one step's; the model ends well below its fixed twin, whose backbone kept training
    assert moved == 0.0 and twin_moved > 0.1, (moved, twin_moved)
    assert grads[-1] > 20 * max(grads[:REBUILD]), (grads[-1], max(grads[:REBUILD]))
    assert accuracy < twin - 0.05, (accuracy, twin)
    assert not frozen(twin_dbg), twin_dbg and twin_dbg.report()

    watched, _, _, dbg = run(rebuilt("head"), watched=True)
    assert watched == accuracy  # the debugger changes nothing
    events = frozen(dbg)
    assert {e.layer for e in events} == {"0"}, dbg and dbg.report()
    assert all(e.metrics.get("left_behind") == 1.0 and e.metrics.get("ongoing") == 1.0 for e in events)
    # dated between the last fully observed step before the rebuild and the first after it
    assert all(REBUILD - 16 <= e.step_start <= REBUILD + 16 for e in events), [e.step_start for e in events]
    assert dbg is not None and "rebuilt over part of the model" in " ".join(dbg.explain_failure())


@pytest.mark.parametrize("how", ["requires_grad", "no_grad"])
def test_a_head_fine_tuned_alone_after_training_everything_is_not_frozen(how: str) -> None:
    accuracy, moved, grads, dbg = run(rebuilt("head"), watched=True, backbone_grad=how)
    # plain torch: the backbone stays still on purpose, and no gradient reaches it any more: what its .grad holds is
    # the last one of the first phase, never added to
    assert moved == 0.0 and len(set(grads[REBUILD:])) == 1, grads[REBUILD : REBUILD + 3]
    assert accuracy > 0.8, accuracy
    assert not frozen(dbg), dbg and dbg.report()


def test_a_backbone_whose_gradient_is_zeroed_every_step_is_not_left_behind() -> None:
    accuracy, moved, grads, dbg = run(rebuilt("head"), watched=True, backbone_grad="zeroed")
    # plain torch: the backbone stays still, and model.zero_grad() clears its gradient every step: what it holds is
    # one step's, never built up. Computed and thrown away, it does not say the backbone was left out by mistake
    assert moved == 0.0 and max(grads[REBUILD:]) < 10 * max(grads[:REBUILD]), (max(grads[REBUILD:]), accuracy)
    assert not frozen(dbg), dbg and dbg.report()


def every_8th(model: nn.Sequential, opts: dict[str, torch.optim.Optimizer], step: int) -> list[torch.optim.Optimizer]:
    """The head's optimizer steps every batch; the backbone's, every 8th on the gradients summed since its last."""
    if step == 0:
        opts["main"] = torch.optim.SGD(model[2:].parameters(), lr=0.05, momentum=0.9)
        opts["backbone"] = torch.optim.SGD(model[:2].parameters(), lr=0.05 / 8, momentum=0.9)
    return [opts["main"], opts["backbone"]] if step % 8 == 7 else [opts["main"]]


def test_a_backbone_stepped_every_8th_batch_on_accumulated_gradients_is_not_frozen() -> None:
    accuracy, moved, grads, dbg = run(every_8th, watched=True)
    # plain torch: the backbone's gradient builds up over 8 batches, then its optimizer steps and zeroes it
    assert moved > 0.1 and grads[6] > grads[0] and accuracy > 0.8, (moved, grads[:8], accuracy)
    assert not frozen(dbg), dbg and dbg.report()
    assert dbg is not None and dbg.healthy, dbg.explain_failure()


def in_turns(*turns: range) -> Program:
    """The head's optimizer steps every batch, the backbone's on its ``turns``; a turn begins by zeroing the gradient
    that built up since the last one."""

    def program(model: nn.Sequential, opts: dict[str, torch.optim.Optimizer], step: int) -> list[torch.optim.Optimizer]:
        if step == 0:
            opts["main"] = torch.optim.SGD(model[2:].parameters(), lr=0.05, momentum=0.9)
            opts["backbone"] = torch.optim.SGD(model[:2].parameters(), lr=0.05, momentum=0.9)
        if not any(step in turn for turn in turns):
            return [opts["main"]]
        if any(step == turn.start for turn in turns):
            opts["backbone"].zero_grad()
        return [opts["main"], opts["backbone"]]

    return program


@pytest.mark.parametrize(
    "turns",
    [
        (range(0, 150), range(250, 350)),  # its last turn ends 250 steps before the end of the run
        (range(0, 100), range(400, STEPS)),  # it sits out half the run, then trains to the end
    ],
)
def test_a_backbone_trained_in_turns_is_not_frozen(turns: tuple[range, range]) -> None:
    accuracy, moved, grads, dbg = run(in_turns(*turns), watched=True)
    # plain torch: between its turns the backbone's gradient builds up, zeroed by nobody until its next turn; it
    # trained on its turns, and the model learns the task
    out = turns[0].stop
    assert moved > 0.1 and grads[out + 99] > 10 * grads[out] and accuracy > 0.8, (grads[out], accuracy)
    assert not frozen(dbg), dbg and dbg.report()


def head_only(model: nn.Sequential, opts: dict[str, torch.optim.Optimizer], step: int) -> list[torch.optim.Optimizer]:
    """One optimizer, over the head, from the start."""
    if step == 0:
        opts["main"] = torch.optim.SGD(model[2:].parameters(), lr=0.05, momentum=0.9)
    return [opts["main"]]


def test_a_backbone_left_out_of_the_only_optimizer_from_the_start_is_frozen_as_before() -> None:
    def head_only(
        model: nn.Sequential, opts: dict[str, torch.optim.Optimizer], step: int
    ) -> list[torch.optim.Optimizer]:
        if step == 0:
            opts["main"] = torch.optim.SGD(model[2:].parameters(), lr=0.05, momentum=0.9)
        return [opts["main"]]

    _, moved, _, dbg = run(head_only, watched=True)
    assert moved == 0.0
    events = frozen(dbg)
    assert {e.layer for e in events} == {"0"}, dbg and dbg.report()
    assert all(e.metrics.get("in_optimizer") == 0.0 and "left_behind" not in e.metrics for e in events)
