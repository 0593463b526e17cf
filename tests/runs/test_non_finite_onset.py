"""A non-finite gradient is dated at its exact step, also on a cheap step (one that gets no full statistics).

Ground truth by plain torch: the first step at which a parameter's ``.grad`` holds an inf or a NaN, read just before
``optimizer.step()``. Cheap steps are those the default schedule does not observe fully: after the first 16 steps,
every 16th step is full, so steps 25 and 37 are cheap."""

from __future__ import annotations

import copy

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.events import EventType

STEPS = 60


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))


def train(
    net: nn.Module, bad_step: int, where: str, watch: bool, host_reads: bool = True
) -> tuple[NeuralDbg | None, list[int]]:
    """Train; at ``bad_step`` either one input element is NaN (``where="input"``) or the loss adds a term whose
    gradient is NaN while its value is finite (``where="backward"``: the square root of an exactly-zero sum, times
    the output). ``host_reads=False`` takes the path of a GPU (every reading left on the device until the flush),
    here on CPU tensors. Returns the debugger and the steps whose gradients held inf or NaN (plain torch)."""
    batches = support.regression_batches()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    bad: list[int] = []
    dbg = NeuralDbg(net) if watch else None
    if dbg is not None:
        dbg._recorder.host_reads_are_free = host_reads
        dbg.__enter__()
    try:
        for step in range(STEPS):
            x, y = batches(step)
            if step == bad_step and where == "input":
                x[3, 5] = float("nan")
            opt.zero_grad()
            out = net(x)
            loss = F.mse_loss(out, y)
            if step == bad_step and where == "backward":
                loss = loss + torch.sqrt((out * 0).pow(2).sum())  # value 0, gradient 0 * inf = NaN
            loss.backward()
            if any(not bool(torch.isfinite(p.grad).all()) for p in net.parameters() if p.grad is not None):
                bad.append(step)
            if step == bad_step and where == "backward":
                assert torch.isfinite(out).all() and torch.isfinite(loss)  # the forward pass stays finite
            opt.step()
            if step == bad_step:  # start again from finite weights: a single bad step
                with torch.no_grad():
                    for p in net.parameters():
                        p.nan_to_num_(0.0)
    finally:
        if dbg is not None:
            dbg.__exit__(None, None, None)
    return dbg, bad


def gradient_onsets(dbg: NeuralDbg) -> set[int]:
    return {e.step_start for e in dbg.events if e.kind is FailureKind.NON_FINITE and e.event_type is EventType.GRADIENT}


@pytest.mark.parametrize("host_reads", [True, False], ids=["cpu_path", "device_path"])
@pytest.mark.parametrize(("where", "bad_step"), [("input", 25), ("backward", 37)])
def test_a_non_finite_gradient_on_a_cheap_step_is_dated_at_that_step(
    where: str, bad_step: int, host_reads: bool
) -> None:
    dbg, bad = train(model(), bad_step, where, watch=True, host_reads=host_reads)
    assert bad == [bad_step]  # plain torch: the gradients are non-finite at that step only
    assert dbg is not None
    assert gradient_onsets(dbg) == {bad_step}
    layers = {e.layer for e in dbg.events if e.kind is FailureKind.NON_FINITE and e.event_type is EventType.GRADIENT}
    assert layers == {"0", "2", "4"}
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NON_FINITE and top.root.step_start == bad_step


class Narrow(nn.Module):
    """Twelve Linear(8, 8) layers between an input and an output layer: gradients of two shapes that repeat, which
    the cheap check sums shape by shape. ``spare``: one more layer that the forward pass never calls (its gradient
    stays None, and the check takes the whole list as one flat copy)."""

    def __init__(self, spare: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(16, 8)
        self.hidden = nn.ModuleList(nn.Linear(8, 8) for _ in range(12))
        self.out = nn.Linear(8, 1)
        self.spare = nn.Linear(8, 8) if spare else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.inp(x))
        for layer in self.hidden:
            x = x + torch.relu(layer(x))
        return self.out(x)


@pytest.mark.parametrize("spare", [False, True], ids=["stacked", "one_flat_copy"])
@pytest.mark.parametrize(("where", "bad_step"), [("input", 25), ("backward", 37)])
def test_a_non_finite_gradient_of_many_small_layers_is_dated_at_its_cheap_step(
    where: str, bad_step: int, spare: bool
) -> None:
    dbg, bad = train(Narrow(spare), bad_step, where, watch=True)
    assert bad == [bad_step]  # plain torch
    assert dbg is not None
    plan = dbg._recorder.backward.grads._plan
    # stacks of the 8-element biases (all but the output's) and of the 8x8 weights, the spare layer's among them
    assert plan is not None and plan.groups == ([14, 13] if spare else [13, 12])
    assert gradient_onsets(dbg) == {bad_step}
    # (the harness zeroes the weights the bad step made NaN: the narrow layers' units then die, a finding of its own)
    found = [h for h in dbg.hypotheses() if h.kind is FailureKind.NON_FINITE]
    assert found and found[0].root.step_start == bad_step


def test_a_healthy_run_of_many_small_layers_has_no_non_finite_finding() -> None:
    dbg, bad = train(Narrow(spare=False), -1, "input", watch=True)
    assert bad == []
    assert dbg is not None and not gradient_onsets(dbg)
    assert dbg._recorder.backward.grads._plan is not None


def test_the_cheap_finite_check_leaves_training_bit_identical() -> None:
    net = model()
    twin = copy.deepcopy(net)
    train(net, 37, "backward", watch=True)
    train(twin, 37, "backward", watch=False)
    for a, b in zip(net.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_a_healthy_run_has_no_non_finite_finding() -> None:
    dbg, bad = train(model(), -1, "input", watch=True)
    assert bad == []
    assert dbg is not None and dbg.hypotheses() == []
