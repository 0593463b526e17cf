"""A step closed after its backward pass and before its update: ``with dbg:`` around the forward and backward
passes, and ``optimizer.step()`` after the block, or in a block of its own.

Until 2026-12-04 the step was committed at ``close()`` and its update measured there, before the optimizer had
stepped: every parameter read unchanged, and a healthy run was reported ``frozen_parameters`` on every layer. The
step now waits for its update: the next attachment measures it once an optimizer of the model has stepped or the
next forward pass begins. Ground truth is plain torch in each test: the weights move (or stay) between steps, and
the loss falls (or not).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 60


def _run(
    pattern: str, left_out: bool = False, never_step: bool = False, steps: int = STEPS
) -> tuple[NeuralDbg, list[float], bool]:
    """A regression MLP under SGD; the debugger, the losses, and whether the first layer's weight ever moved."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    params = list(model[2].parameters()) if left_out else list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.05)
    teacher = torch.randn(8, 1, generator=torch.Generator().manual_seed(1))
    first = model[0].weight.detach().clone()
    dbg = NeuralDbg(model)
    losses: list[float] = []
    for step in range(steps):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(100 + step))
        y = x @ teacher
        opt.zero_grad()
        if pattern == "whole":
            with dbg:
                loss = F.mse_loss(model(x), y)
                loss.backward()
                if not never_step:
                    opt.step()
        else:
            with dbg:
                loss = F.mse_loss(model(x), y)
                loss.backward()
            if never_step:
                pass
            elif pattern == "step_after":
                opt.step()
            else:  # "step_own": the optimizer step in an attachment of its own
                with dbg:
                    opt.step()
        losses.append(loss.item())
    moved = not bool((model[0].weight == first).all())
    return dbg, losses, moved


def _frozen(dbg: NeuralDbg) -> set[str]:
    return {e.param for e in dbg.events if e.kind is FailureKind.FROZEN_PARAMETERS and e.param is not None}


def test_a_healthy_run_whose_optimizer_steps_after_the_block_is_silent():
    for pattern in ("whole", "step_after", "step_own"):
        dbg, losses, moved = _run(pattern)
        assert moved and losses[-1] < 0.05 * losses[0], pattern  # plain torch: it trains
        assert _frozen(dbg) == set(), pattern
        assert dbg.hypotheses() == [], pattern


def test_a_layer_left_out_of_the_optimizer_is_still_found_in_those_patterns():
    for pattern in ("whole", "step_after", "step_own"):
        dbg, _, moved = _run(pattern, left_out=True)
        assert not moved, pattern  # plain torch: the first layer never changes
        assert _frozen(dbg) == {"0.weight", "0.bias"}, pattern  # the second layer, stepped, is not frozen


def test_an_optimizer_that_never_steps_is_still_found_with_the_block_around_forward_and_backward():
    dbg, losses, moved = _run("step_after", never_step=True)
    assert not moved and losses[-1] > 0.5 * losses[0]  # plain torch: nothing trains
    assert _frozen(dbg) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_the_step_waiting_for_its_update_is_counted_and_read_when_the_run_is_read_while_detached():
    dbg, _, _ = _run("step_after", steps=49)  # the last step, 48, is fully observed: its update is measured
    assert dbg.steps == 49  # ... so it waits for an update no attachment will see, and is counted
    assert dbg._recorder.awaiting is not None and dbg._recorder.awaiting[0].data.step == 48
    losses = dbg.history.get("loss", "")  # reading the run files it, without an update
    assert losses is not None and losses.at(48) is not None  # its loss with it
    assert dbg._recorder.awaiting is None and dbg.steps == 49
    assert dbg.hypotheses() == []


def test_the_waiting_step_reads_its_own_update_when_the_next_attachment_trains_on():
    """Step 48 (fully observed) closed before its update, ``optimizer.step()`` outside, then 12 more steps in one
    attachment: the update filed for step 48 is its own (plain torch: the first layer's change over that optimizer
    step), not the sum of the updates made in the next attachment."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    teacher = torch.randn(8, 1, generator=torch.Generator().manual_seed(1))
    dbg = NeuralDbg(model)
    records = []
    analysis = dbg._recorder._sink

    def sink(batch):
        records.extend(batch)
        return analysis(batch)

    dbg._recorder._sink = sink

    def step(i: int, attached: bool) -> None:
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(100 + i))
        opt.zero_grad()
        F.mse_loss(model(x), x @ teacher).backward()
        if attached:
            opt.step()

    with dbg:
        for i in range(48):
            step(i, attached=True)
    with dbg:
        step(48, attached=False)
    before = model[0].weight.detach().clone()
    opt.step()
    own = float((model[0].weight.detach() - before).norm())
    with dbg:
        for i in range(49, 61):
            step(i, attached=True)
    dbg.close()
    (held,) = [r for r in records if r.step == 48]
    assert held.full
    assert abs(held.update["0.weight"][0] - own) < 1e-6 * max(own, 1.0)
    assert own > 0 and dbg.hypotheses() == []
