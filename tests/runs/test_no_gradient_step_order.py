"""``optimizer.step()`` called before ``loss.backward()`` (sweep M, F3): the loop resets the gradients at its top, runs
the forward pass, steps, then backpropagates; each step finds the previous backward pass's gradients reset to None
and moves nothing. The debugger found ``no_gradient`` but said ``zero_grad()`` is called between ``backward()`` and
``step()`` and told the user to call it before the forward pass, which the loop already does. It now names the step
called before the backward pass, and keeps the old words for the loop they describe (forward, backward,
zero_grad, step).

Ground truth by plain torch: the gradients are None at every step in both faulty orders, the parameters end
where they started, and the twin in the right order moves them and learns."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind

STEPS = 96


def run(order: str, watched: bool) -> dict:
    """``order``: "step_first" (zero_grad, forward, step, backward), "reset_between" (forward, backward, zero_grad,
    step) or "right" (zero_grad, forward, backward, step)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(512, 10, generator=g)
    y = (x @ torch.randn(10, 4, generator=g)).argmax(1)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    start = [p.detach().clone() for p in model.parameters()]
    out: dict = {"losses": [], "at_step": []}

    def step() -> None:
        grad = model[0].weight.grad
        out["at_step"].append(None if grad is None else float(grad.abs().max()))
        opt.step()

    def loop() -> None:
        for _ in range(STEPS):
            i = torch.randint(0, 512, (32,), generator=g)
            if order != "reset_between":
                opt.zero_grad()
            loss = F.cross_entropy(model(x[i]), y[i])
            if order == "step_first":
                step()
                loss.backward()
            else:
                loss.backward()
                if order == "reset_between":
                    opt.zero_grad()
                step()
            out["losses"].append(loss.item())

    out["dbg"] = support.watching(model, loop, watched)
    out["moved"] = any(not torch.equal(p.detach(), s) for p, s in zip(model.parameters(), start, strict=True))
    return out


def _fell(losses: list[float]) -> bool:
    return sum(losses[-20:]) / 20 < 0.7 * sum(losses[:20]) / 20


def test_ground_truth_both_wrong_orders_step_with_no_gradient_and_the_right_one_learns() -> None:
    for order in ("step_first", "reset_between"):
        plain = run(order, watched=False)
        assert all(v is None for v in plain["at_step"]), order
        assert not plain["moved"] and not _fell(plain["losses"]), order
    right = run("right", watched=False)
    assert right["moved"] and _fell(right["losses"])
    assert all(v is not None and v > 0 for v in right["at_step"])


def test_a_step_before_the_backward_pass_is_named_with_the_fix_that_moves_the_backward_pass() -> None:
    out = run("step_first", watched=True)
    assert out["losses"] == run("step_first", watched=False)["losses"]  # the run is unchanged
    dbg = out["dbg"]
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NO_GRADIENT
    text = dbg.explain_failure()[0]
    assert "optimizer.step() is called before loss.backward()" in text
    assert "Fix: call loss.backward() before optimizer.step()" in text
    assert "before the forward pass" not in text and "between loss.backward() and optimizer.step()" not in text
    assert "optimizer.step() before loss.backward() on" in str(top.root)


def test_a_reset_between_backward_and_step_keeps_its_own_words_and_the_right_order_is_silent() -> None:
    dbg = run("reset_between", watched=True)["dbg"]
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NO_GRADIENT
    text = dbg.explain_failure()[0]
    assert "is called between loss.backward() and optimizer.step()" in text
    assert "call optimizer.zero_grad() before the forward pass" in text
    assert "called before loss.backward()" not in text
    dbg = run("right", watched=True)["dbg"]
    assert not dbg.hypotheses(), dbg.explain_failure()
    coverage = dbg._recorder.coverage
    assert coverage.handed_steps == STEPS and coverage.forward_before_step == 0
