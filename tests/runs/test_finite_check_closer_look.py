"""A cheap step whose gradients are huge but finite is not called non-finite (on a CPU the first look takes the
float32 norms, which overflow from about 1.8e19; the exact probes decide), and a gradient holding only -inf is
dated at its step on both paths.

Ground truth by plain torch: ``torch.isfinite`` on every ``.grad`` before ``optimizer.step()``."""

from __future__ import annotations

import math

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.events import EventType

STEPS = 40
SPECIAL = 25  # a cheap step of the default schedule (after the first 16 steps, every 16th is full)


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def train(host_reads: bool, what: str) -> tuple[NeuralDbg, list[int], bool]:
    """At step ``SPECIAL`` the loss is multiplied by 1e21 (``what="huge"``: every gradient finite, the float32 norm
    of the largest overflows) or the head bias's gradient is set to -inf (``what="minus_inf"``); the parameters are
    put back after that step's update. Returns the debugger, the steps whose gradients held inf or NaN, and whether
    a float32 norm overflowed at the special step."""
    net = model()
    batches = support.regression_batches()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    bad: list[int] = []
    overflowed = False
    dbg = NeuralDbg(net)
    dbg._recorder.host_reads_are_free = host_reads
    with dbg:
        for step in range(STEPS):
            x, y = batches(step)
            opt.zero_grad()
            loss = F.mse_loss(net(x), y)
            if step == SPECIAL and what == "huge":
                loss = loss * 1e21
            loss.backward()
            if step == SPECIAL and what == "minus_inf":
                net[4].bias.grad.fill_(-math.inf)
            grads = [p.grad for p in net.parameters() if p.grad is not None]
            if any(not bool(torch.isfinite(g).all()) for g in grads):
                bad.append(step)
            if step == SPECIAL:
                overflowed = any(math.isinf(float(n)) for n in torch._foreach_norm(grads))
                kept = [p.detach().clone() for p in net.parameters()]
            opt.step()
            if step == SPECIAL:
                with torch.no_grad():
                    for p, k in zip(net.parameters(), kept):
                        p.copy_(k)
    return dbg, bad, overflowed


def non_finite_gradients(dbg: NeuralDbg) -> set[tuple[int, str]]:
    return {
        (e.step_start, e.layer)
        for e in dbg.events
        if e.kind is FailureKind.NON_FINITE and e.event_type is EventType.GRADIENT
    }


@pytest.mark.parametrize("host_reads", [True, False], ids=["cpu_path", "device_path"])
def test_huge_finite_gradients_on_a_cheap_step_are_not_called_non_finite(host_reads: bool) -> None:
    dbg, bad, overflowed = train(host_reads, "huge")
    assert bad == [] and overflowed  # plain torch: finite, yet a float32 norm is inf
    assert non_finite_gradients(dbg) == set()


@pytest.mark.parametrize("host_reads", [True, False], ids=["cpu_path", "device_path"])
def test_a_gradient_holding_only_minus_inf_is_dated_at_its_cheap_step(host_reads: bool) -> None:
    dbg, bad, _ = train(host_reads, "minus_inf")
    assert bad == [SPECIAL]
    assert non_finite_gradients(dbg) == {(SPECIAL, "4")}
