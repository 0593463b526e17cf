"""``optimizer.zero_grad()`` called between ``loss.backward()`` and ``optimizer.step()``: the backward pass leaves
gradients on every parameter, the reset removes them, and the step moves nothing (hunt 20). The debugger said
"stalled updates ... raise the learning rate" (``set_to_none=True``, the default) or "vanishing gradients ... add
residual connections" (``set_to_none=False``); it is ``no_gradient``, with the misplaced call named.

Ground truth by plain torch: the gradients are present right after ``backward()`` and gone (None, or all zeros)
at ``step()``; the parameters end exactly where they started, and the loss does not fall. The twins (the reset
before the forward pass; clipping, which changes the gradients in place between the two calls; accumulation over
four backward passes) train and must stay silent about it."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind
from neuraldbg.capture.coverage import Coverage
from neuraldbg.kinds import no_gradient

STEPS = 120


def run(order: str, watched: bool) -> dict:
    """``order``: "reset_first" (healthy), "reset_between" (the bug, set_to_none), "zeroed_between" (the bug,
    set_to_none=False), "clipped" (healthy, clip_grad_norm_ between backward and step) or "accumulated" (healthy,
    four backward passes a step)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(512, 10, generator=g)
    y = (x @ torch.randn(10, 4, generator=g)).argmax(1)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    start = [p.detach().clone() for p in model.parameters()]
    out: dict = {"losses": [], "left": [], "at_step": []}

    def loop() -> None:
        for _ in range(STEPS):
            i = torch.randint(0, 512, (32,), generator=g)
            if order in ("reset_first", "clipped"):
                opt.zero_grad()
            loss = F.cross_entropy(model(x[i]), y[i])
            loss.backward()
            out["left"].append(float(model[0].weight.grad.abs().max()))
            if order == "accumulated":
                for _ in range(3):
                    j = torch.randint(0, 512, (32,), generator=g)
                    F.cross_entropy(model(x[j]), y[j]).backward()
            if order == "reset_between":
                opt.zero_grad()
            if order == "zeroed_between":
                opt.zero_grad(set_to_none=False)
            if order == "clipped":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            grad = model[0].weight.grad
            out["at_step"].append(None if grad is None else float(grad.abs().max()))
            opt.step()
            if order == "accumulated":
                opt.zero_grad()
            out["losses"].append(loss.item())

    out["dbg"] = support.watching(model, loop, watched)
    out["moved"] = any(not torch.equal(p.detach(), s) for p, s in zip(model.parameters(), start, strict=True))
    return out


def _fell(losses: list[float]) -> bool:
    return sum(losses[-20:]) / 20 < 0.7 * sum(losses[:20]) / 20


def test_ground_truth_the_reset_between_backward_and_step_removes_what_backward_left() -> None:
    for order, gone in (("reset_between", None), ("zeroed_between", 0.0)):
        plain = run(order, watched=False)
        assert min(plain["left"]) > 0  # backward left gradients every step
        assert all(v == gone for v in plain["at_step"])  # ... and the step found none
        assert not plain["moved"] and not _fell(plain["losses"])
    for order in ("reset_first", "clipped", "accumulated"):
        plain = run(order, watched=False)
        assert plain["moved"] and _fell(plain["losses"])
        assert all(v is not None and v > 0 for v in plain["at_step"])


def test_gradients_reset_to_none_before_the_step_are_no_gradient_naming_the_misplaced_call() -> None:
    out = run("reset_between", watched=True)
    assert out["losses"] == run("reset_between", watched=False)["losses"]  # the run is unchanged
    dbg = out["dbg"]
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NO_GRADIENT and top.step == 0
    text = dbg.explain_failure()[0]
    assert "reset to None" in text and f"every one of {STEPS} optimizer steps" in text
    assert "between loss.backward() and optimizer.step()" in text
    assert "raise the learning rate" not in text


def test_gradients_zeroed_in_place_before_the_step_are_no_gradient_too() -> None:
    out = run("zeroed_between", watched=True)
    assert out["losses"] == run("zeroed_between", watched=False)["losses"]
    dbg = out["dbg"]
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NO_GRADIENT
    text = dbg.explain_failure()[0]
    assert "zeroed in place" in text and "residual" not in text


def test_a_reset_before_the_forward_pass_clipping_and_accumulation_are_silent() -> None:
    for order in ("reset_first", "clipped", "accumulated"):
        out = run(order, watched=True)
        dbg = out["dbg"]
        assert FailureKind.NO_GRADIENT.value not in support.kinds(dbg), order
        assert not dbg.hypotheses(), (order, dbg.explain_failure())
        coverage = dbg._recorder.coverage
        assert coverage.handed_steps == STEPS and coverage.cleared_steps == 0
        assert coverage.zeroed_steps == 0
        if order == "clipped":  # changed in place between the two calls, every fully observed step: read, not zero
            assert coverage.left_readings > 0


def test_a_few_cleared_steps_or_a_minority_are_not_a_finding() -> None:
    facts = no_gradient.RunFacts(trainable=10, backward_passes=100, optimizer_steps=100)
    kind = no_gradient.NoGradient()
    for cleared, handed in ((2, 2), (40, 100)):
        coverage = Coverage(steps=100, last_step=99, handed_steps=handed, cleared_steps=cleared, first_cleared=0)
        assert kind.run_finding(coverage, facts) is None, (cleared, handed)
    coverage = Coverage(steps=100, last_step=99, handed_steps=100, cleared_steps=60, first_cleared=5)
    event = kind.run_finding(coverage, facts)
    assert event is not None and event.step_start == 5
    assert "60 of 100" in kind.explain(event, [], None, {})[0]  # type: ignore[arg-type]
