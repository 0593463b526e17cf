"""A debugger closed between a step's backward pass and its optimizer step: ``with dbg:`` around the forward and
backward passes, ``optimizer.step()`` after the block. ``close()`` commits the step before its update, so every
parameter read unchanged, and until 2026-12-05 a healthy run was reported ``frozen_parameters`` on every layer. Such
a step's update is now unknown, not zero (``Pending.drop_unapplied_update``): dropped when no optimizer of the model
stepped in it and no parameter moved, with a warning from the second such close. A zero update read any other way
still stands: a layer left out of an optimizer inside the block, an ``optimizer.step()`` forgotten in a loop
watched as a whole, an optimizer at learning rate 0.

Ground truth by plain torch in each test: whether each layer's weights changed over the run, and the loss."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg, NeuralDbgWarning
from neuraldbg.capture.pending import Pending

STEPS = 120
_X = torch.randn(256, 4, generator=torch.Generator().manual_seed(0))
_Y = (_X @ torch.tensor([1.0, -2.0, 0.5, 3.0])).unsqueeze(1)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _moved(before: dict[str, torch.Tensor], model: nn.Module) -> set[str]:
    return {name for name, p in model.named_parameters() if not torch.equal(before[name], p.detach())}


def _frozen(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind is FailureKind.FROZEN_PARAMETERS]


def _run_with_step_after_the_block(
    left_out: bool = False,
) -> tuple[list[float], set[str], NeuralDbg, list[warnings.WarningMessage]]:
    model = _model()
    params = list(model[2].parameters()) if left_out else list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.05)
    start = _weights(model)
    dbg = NeuralDbg(model)
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(STEPS):
            opt.zero_grad()
            with dbg:
                loss = F.mse_loss(model(_X), _Y)
                loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    return losses, _moved(start, model), dbg, [w for w in caught if issubclass(w.category, NeuralDbgWarning)]


def test_a_healthy_run_stepping_after_the_block_is_not_called_frozen() -> None:
    losses, moved, dbg, caught = _run_with_step_after_the_block()
    assert losses[-1] < losses[0] / 100  # plain torch: it trains (14.2 -> 0.03)
    assert moved == {"0.weight", "0.bias", "2.weight", "2.bias"}  # ... and every parameter moved
    assert not _frozen(dbg), dbg.report()
    assert not dbg.explain_failure(), dbg.report()
    # the user is told the updates were not measured, and why: once
    assert len(caught) == 1
    assert "outside the `with` block" in str(caught[0].message)
    # every fully observed step (the only ones whose update is read) had its update dropped
    assert dbg._recorder.coverage.unapplied_updates == dbg._analyzer.full_steps >= 16


def test_a_layer_left_out_with_the_step_after_the_block_goes_unjudged_and_the_user_is_told() -> None:
    """The price of the rule: in this loop the debugger never sees an update, so a layer truly left out of the
    optimizer is not reported either; the warning says frozen parameters are not checked."""
    losses, moved, dbg, caught = _run_with_step_after_the_block(left_out=True)
    assert moved == {"2.weight", "2.bias"}  # plain torch: the first layer never changes
    assert losses[-1] < losses[0]
    assert not _frozen(dbg)
    assert len(caught) == 1 and "frozen or stalled parameters are not checked" in str(caught[0].message)


def _run_in_one_block(step: bool, left_out: bool = False, lr: float = 0.05, per_step_blocks: bool = False):
    model = _model()
    params = list(model[2].parameters()) if left_out else list(model.parameters())
    opt = torch.optim.SGD(params, lr=lr)
    start = _weights(model)
    dbg = NeuralDbg(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if per_step_blocks:
            for _ in range(STEPS):
                with dbg:
                    opt.zero_grad()
                    F.mse_loss(model(_X), _Y).backward()
                    if step:
                        opt.step()
        else:
            with dbg:
                for _ in range(STEPS):
                    opt.zero_grad()
                    F.mse_loss(model(_X), _Y).backward()
                    if step:
                        opt.step()
    return _moved(start, model), dbg, [w for w in caught if issubclass(w.category, NeuralDbgWarning)]


def test_a_layer_left_out_of_the_optimizer_inside_the_block_is_still_reported() -> None:
    moved, dbg, caught = _run_in_one_block(step=True, left_out=True)
    assert moved == {"2.weight", "2.bias"}
    found = _frozen(dbg)
    assert found and "0" in found[0].root.layer, dbg.report()
    assert not caught


@pytest.mark.parametrize("per_step_blocks", [False, True])
def test_a_forgotten_optimizer_step_is_still_reported_when_the_next_step_commits(per_step_blocks: bool) -> None:
    """``optimizer.step()`` never called, the loop watched as a whole: each step is committed by the next one's
    forward pass, nothing moved in between, and its zero update stands. A block per iteration closes every step
    before anything could move it: unknown, as in the first test, and the user is told."""
    moved, dbg, caught = _run_in_one_block(step=False, per_step_blocks=per_step_blocks)
    assert moved == set()  # plain torch: nothing ever changes
    if per_step_blocks:
        assert not _frozen(dbg) and len(caught) == 1
    else:
        assert _frozen(dbg), dbg.report()
        assert not caught


def test_an_optimizer_that_steps_inside_each_block_keeps_its_zero_update() -> None:
    """Learning rate 0, the optimizer stepped inside a block per iteration: it stepped, so the zero update is
    its own (nothing dropped, no warning), and the run is reported as before the rule."""
    moved, dbg, caught = _run_in_one_block(step=True, lr=0.0, per_step_blocks=True)
    assert moved == set()
    assert dbg._recorder.coverage.unapplied_updates == 0
    assert not caught
    assert dbg.explain_failure(), dbg.report()


def test_one_close_before_a_step_is_counted_without_a_warning() -> None:
    """A loop stepped by hand (no optimizer: steps are told by backward passes) that ends between a backward pass
    and its update closes once so: that step's update is dropped, counted, and no warning is given for it. Every
    step before it was committed by the next one, after its update: their updates stand (no frozen parameters,
    every parameter moved by plain torch)."""
    model = _model()
    start = _weights(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with NeuralDbg(model) as dbg:
            for step in range(17):
                model.zero_grad()
                F.mse_loss(model(_X), _Y).backward()
                if step < 16:
                    with torch.no_grad():
                        for p in model.parameters():
                            p -= 0.05 * p.grad
    assert _moved(start, model) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert not [w for w in caught if issubclass(w.category, NeuralDbgWarning)]
    assert dbg._recorder.coverage.unapplied_updates == 1
    assert not _frozen(dbg), dbg.report()


def _filed(closing: bool, deltas: tuple[float, ...], stepped: bool = False, optimizer: bool = False) -> Pending:
    part = Pending(3, True)
    part.closing = closing
    for i, delta in enumerate(deltas):
        part.data.update[f"p{i}"] = (delta, 1.0)
        part.data.update_before[f"p{i}"] = 1.0
    if stepped:
        part.data.stepped["p0"] = 0.1
    if optimizer:
        part.data.optimizers.add(1)
    return part


@pytest.mark.parametrize(
    ("part", "dropped"),
    [
        (_filed(True, (0.0, 0.0)), True),
        (_filed(False, (0.0, 0.0)), False),  # committed by the next step: the zero stands
        (_filed(True, (0.0, 1e-6)), False),  # something moved: the update happened before close()
        (_filed(True, (0.0, 0.0), stepped=True), False),  # an optimizer stepped the parameters without moving them
        (_filed(True, (0.0, 0.0), optimizer=True), False),
        (_filed(True, ()), False),  # no update read: nothing to drop
    ],
)
def test_which_updates_are_dropped(part: Pending, dropped: bool) -> None:
    before = dict(part.data.update)
    assert part.drop_unapplied_update() is dropped
    assert part.data.update == ({} if dropped else before)
    assert part.data.update_before == ({} if dropped else dict.fromkeys(before, 1.0))
