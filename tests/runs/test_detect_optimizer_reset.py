"""The optimizer made inside the training loop (``optimizer_reset``): a new ``SGD(momentum=0.9)`` before every batch
throws its momentum buffer away, so every step is plain SGD's, ten times smaller than the run the settings describe.
Ground truth is plain torch in each test: the optimizer's state is empty before every step, and the held-out
accuracy falls far below the twin whose optimizer is made once. Also found: Adam made anew each batch (each step
its first). Silent twins: the optimizer made once; SGD without momentum made anew each batch (it keeps nothing
between steps: the training is bit-identical to the optimizer made once); a new optimizer each epoch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.capture.coverage import Coverage, RunFacts
from neuraldbg.kinds import optimizer_reset

KIND = "optimizer_reset"
EPOCHS, BATCHES, BATCH = 8, 32, 64
Make = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four classes from a fixed random tanh teacher on 20 features."""
    g = torch.Generator().manual_seed(1234)
    w1, w2 = torch.randn(20, 32, generator=g), torch.randn(32, 4, generator=g)
    x = torch.randn(n, 20, generator=torch.Generator().manual_seed(seed))
    return x, (torch.tanh(x @ w1 / 20**0.5 * 2) @ w2).argmax(1)


def sgd_momentum(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def train(
    make: Make, anew: str, watched: bool, fresh: list[bool] | None = None
) -> tuple[float, nn.Module, NeuralDbg | None]:
    """A user's loop over epochs of shuffled batches; ``anew``: where the optimizer is made ("once" before the loop,
    "batch" before every batch, "epoch" before every epoch). ``fresh`` collects, per step, whether the optimizer's
    state was empty before it (plain torch). Returns the held-out accuracy, the model and the debugger."""
    torch.manual_seed(0)
    x, y = data(BATCHES * BATCH, 1)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = make(list(model.parameters()))
    order = torch.Generator().manual_seed(100)

    def loop() -> None:
        nonlocal opt
        for _ in range(EPOCHS):
            if anew == "epoch":
                opt = make(list(model.parameters()))
            perm = torch.randperm(len(x), generator=order)
            for i in range(0, len(x), BATCH):
                if anew == "batch":
                    opt = make(list(model.parameters()))
                idx = perm[i : i + BATCH]
                opt.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                if fresh is not None:
                    fresh.append(not opt.state)
                opt.step()

    dbg = support.watching(model, loop, watched)
    xt, yt = data(1024, 999)
    with torch.no_grad():
        return float((model(xt).argmax(1) == yt).float().mean()), model, dbg


def found(dbg: NeuralDbg | None) -> list:
    assert dbg is not None
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_sgd_with_momentum_made_before_every_batch_is_found_with_its_tenfold_smaller_steps():
    fresh: list[bool] = []
    acc, _, _ = train(sgd_momentum, "batch", watched=False, fresh=fresh)
    twin, _, _ = train(sgd_momentum, "once", watched=False)
    # plain torch: the state is empty before every step, and the run falls far behind its twin
    assert all(fresh) and len(fresh) == EPOCHS * BATCHES
    assert acc < 0.6 and twin > 0.72, (acc, twin)

    _, _, dbg = train(sgd_momentum, "batch", watched=True)
    hits = found(dbg)
    assert hits, dbg.explain_failure() if dbg else ""
    assert dbg is not None and dbg.hypotheses()[0].kind.value == KIND
    root = hits[0].root
    assert root.metrics["reset"] == root.metrics["optimizer_steps"] == EPOCHS * BATCHES
    assert root.metrics["momentum"] == 0.9 and root.detail == "SGD"
    assert root.step_start == 1  # the first step starts from nothing in any run
    text = hits[0].explanation
    assert "10x smaller" in text and "momentum 0.9" in text and "before the training loop" in text

    _, _, silent = train(sgd_momentum, "once", watched=True)
    assert not found(silent), silent.explain_failure() if silent else ""


def test_adam_made_before_every_batch_is_found_as_taking_its_first_step_every_time():
    def adam(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=1e-3)

    fresh: list[bool] = []
    train(adam, "batch", watched=False, fresh=fresh)
    assert all(fresh)  # plain torch: every step is the optimizer's first
    _, _, dbg = train(adam, "batch", watched=True)
    hits = found(dbg)
    assert hits, dbg.explain_failure() if dbg else ""
    assert hits[0].root.metrics["moments"] == 1.0 and "momentum" not in hits[0].root.metrics
    assert "sign of its gradient" in hits[0].explanation


class Counted(torch.optim.Optimizer):
    """Plain SGD written by hand that notes, per parameter, a step count (0-d) and an empty momentum buffer: state
    that carries nothing the next step uses, as some optimizers keep."""

    def __init__(self, params: list[nn.Parameter], lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def,override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])
                state = self.state[p]
                state["step"] = state.get("step", torch.tensor(0.0)) + 1
                state["momentum_buffer"] = None


@pytest.mark.parametrize("kind", [torch.optim.SGD, Counted])
def test_sgd_without_momentum_made_before_every_batch_keeps_nothing_between_steps_and_is_silent(kind):
    def sgd(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return kind(params, lr=0.05)

    _, anew, _ = train(sgd, "batch", watched=False)
    _, once, _ = train(sgd, "once", watched=False)
    # plain torch: nothing is lost, the two trainings are bit-identical
    assert all(torch.equal(a, b) for a, b in zip(anew.parameters(), once.parameters()))
    _, _, dbg = train(sgd, "batch", watched=True)
    assert not found(dbg), dbg.explain_failure() if dbg else ""
    assert dbg is not None and dbg._recorder.coverage.reset_steps == 0


def test_a_new_optimizer_each_epoch_is_silent():
    fresh: list[bool] = []
    train(sgd_momentum, "epoch", watched=False, fresh=fresh)
    assert sum(fresh) == EPOCHS  # plain torch: it starts over once an epoch
    _, _, dbg = train(sgd_momentum, "epoch", watched=True)
    assert not found(dbg), dbg.explain_failure() if dbg else ""
    assert dbg is not None and dbg._recorder.coverage.reset_steps == EPOCHS


def test_a_short_run_or_a_minority_of_fresh_steps_is_not_a_finding():
    kind = optimizer_reset.OptimizerReset()

    def finding(reset: int, steps: int) -> bool:
        coverage = Coverage(steps=steps, last_step=steps - 1, reset_steps=reset, first_reset=1, reset_optimizer="SGD")
        return (
            kind.run_finding(coverage, RunFacts(trainable=10, backward_passes=steps, optimizer_steps=steps)) is not None
        )

    assert finding(16, 16) and finding(75, 100)
    assert not finding(15, 15)  # too few steps to tell a loop
    assert not finding(74, 100)  # a minority starting over (an optimizer made anew every other step: a half)
