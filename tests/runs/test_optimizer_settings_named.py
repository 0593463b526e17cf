"""Optimizer settings besides the learning rate that make the steps far too small or far too large are named, with
their own fix, where they explain the finding: an adaptive optimizer's eps far above the gradients' root-mean-square
(Adam's steps shrink to SGD's), and momentum of 0.99 or more (each step adds up ~1 / (1 - momentum) gradients).
Ground truth is plain torch in each test: the named setting is the cause (its usual value alone trains the model),
and twins at usual settings whose learning rate is the fault keep the learning-rate advice."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

CLASSES = 10
STEPS = 200
Loop = Callable[[], None]


def watched(model: nn.Module, loop: Loop) -> NeuralDbg:
    with NeuralDbg(model) as dbg:
        loop()
    return dbg


# ------------------------------------------------------------------------------------------- Adam's eps


def classify(lr: float, eps: float) -> tuple[nn.Module, Loop]:
    """An MLP classifier under Adam: the model, and the user's loop (no NeuralDBG call inside)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, eps=eps)
    make = support.classification_batches((32,), CLASSES, batch=64)

    def loop() -> None:
        for step in range(STEPS):
            x, y = make(step)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    return model, loop


def accuracy(lr: float, eps: float) -> float:
    """Held-out accuracy after training unwatched (chance is 0.1)."""
    model, loop = classify(lr, eps)
    loop()
    x, y = support.classification_batches((32,), CLASSES, batch=1024)(10_000)
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def first_update(optimizer: type[torch.optim.Optimizer], **settings: float) -> torch.Tensor:
    """The first step's update of the classifier's first weight under ``optimizer``."""
    model, _ = classify(1e-3, 1e-8)
    x, y = support.classification_batches((32,), CLASSES, batch=64)(0)
    before = model[0].weight.detach().clone()
    step = optimizer(model.parameters(), **settings)
    F.cross_entropy(model(x), y).backward()
    step.step()
    return model[0].weight.detach() - before


@pytest.mark.parametrize("eps", [1.0, 100.0])  # the run's updates add up to too little / each step is stalled
def test_adam_eps_far_above_the_gradients_is_named(eps: float) -> None:
    # ground truth: at eps >> |g| Adam's step is lr * g / eps, SGD's at lr / eps; the default eps alone trains
    adam, sgd = first_update(torch.optim.Adam, lr=1e-3, eps=eps), first_update(torch.optim.SGD, lr=1e-3 / eps)
    assert torch.allclose(adam, sgd, rtol=0.05, atol=1e-3 * float(sgd.abs().max()))
    assert accuracy(1e-3, eps) < 0.2 and accuracy(1e-3, 1e-8) > 0.6

    dbg = watched(*classify(1e-3, eps))
    hypothesis = dbg.hypotheses()[0]
    assert hypothesis.root.kind.value == "stalled_updates"
    assert f"The optimizer's eps={eps:g} is about" in hypothesis.explanation
    assert hypothesis.suggestion.startswith("use the default eps=1e-8")
    assert "raise the learning rate" not in hypothesis.suggestion


def test_adam_learning_rate_too_low_keeps_the_learning_rate_advice() -> None:
    # ground truth: at the default eps the learning rate is the fault: 1e-6 stays at chance, 1e-3 trains
    assert accuracy(1e-6, 1e-8) < 0.2 and accuracy(1e-3, 1e-8) > 0.6

    dbg = watched(*classify(1e-6, 1e-8))
    hypothesis = dbg.hypotheses()[0]
    assert hypothesis.root.kind.value == "stalled_updates"
    assert hypothesis.suggestion.startswith("raise the learning rate (about ")
    assert "eps" not in hypothesis.explanation


def test_stall_at_the_edge_of_the_limit_is_dated_over_the_whole_run() -> None:
    # ground truth: at eps=10 each step moves the weights by about the per-step limit (1e-5) from step 0 on, and the
    # model stays at chance; the rule finds the steps below the limit in stretches, the first one later
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=10.0)
    make = support.classification_batches((32,), CLASSES, batch=64)
    ratios = []
    for step in range(10):
        x, y = make(step)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.step()
        ratios.append(support.median_update_ratio(model.parameters(), before))
    assert max(ratios) < 3e-5 and accuracy(1e-3, 10.0) < 0.2

    hypothesis = watched(*classify(1e-3, 10.0)).hypotheses()[0]
    assert hypothesis.root.kind.value == "stalled_updates" and hypothesis.root.step_start > 0
    assert f"Over the whole run, steps 0 to {STEPS - 1}, the updates added up to" in hypothesis.explanation


# ------------------------------------------------------------------------------------------- SGD's momentum


def regress(
    lr: float, momentum: float, activation: type[nn.Module] = nn.ReLU
) -> tuple[nn.Module, Loop, Callable[[], float]]:
    """An MLP regression under SGD with momentum (8 epochs of 32 batches): the model, the user's loop, and the
    held-out R^2 after it."""
    teacher = torch.randn(10, 3, generator=torch.Generator().manual_seed(4321))

    def data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 10, generator=g)
        h = x @ teacher / 10**0.5
        y = torch.sin(2 * h[:, 0]) + h[:, 1] ** 2 - h[:, 2]
        return x, y.unsqueeze(1) + 0.05 * torch.randn(n, 1, generator=g)

    (x_train, y_train), (x_test, y_test) = data(2048, 1), data(1024, 999)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), activation(), nn.Linear(64, 64), activation(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)

    def loop() -> None:
        g = torch.Generator().manual_seed(100)
        for _ in range(8):
            order = torch.randperm(2048, generator=g)
            for i in range(0, 2048, 64):
                batch = order[i : i + 64]
                optimizer.zero_grad()
                F.mse_loss(model(x_train[batch]), y_train[batch]).backward()
                optimizer.step()

    def r2() -> float:
        with torch.no_grad():
            return 1 - float(F.mse_loss(model(x_test), y_test)) / float(y_test.var())

    return model, loop, r2


def held_out(lr: float, momentum: float, activation: type[nn.Module] = nn.ReLU) -> float:
    _, loop, r2 = regress(lr, momentum, activation)
    loop()
    return r2()


def test_momentum_0999_is_named_before_the_learning_rate() -> None:
    # ground truth: momentum 0.9 alone trains; the learning rate 10x lower at momentum 0.999 still does not
    assert held_out(0.1, 0.999) < 0.0
    assert held_out(0.01, 0.999) < 0.3
    assert held_out(0.1, 0.9) > 0.85

    model, loop, _ = regress(0.1, 0.999)
    hypothesis = watched(model, loop).hypotheses()[0]
    assert hypothesis.root.kind.value == "dead_neurons"
    assert "The optimizer's momentum=0.999 makes each step add up about 1,000 gradients" in hypothesis.explanation
    assert hypothesis.suggestion.startswith("use momentum=0.9 ")
    assert "lower the learning rate" not in hypothesis.suggestion


def test_momentum_0999_is_named_where_it_saturates_a_tanh_network() -> None:
    # ground truth: the same regression through tanh units; momentum 0.9 at the same learning rate trains, 0.999
    # drives the activations to their bounds and the fit apart
    assert held_out(0.05, 0.999, nn.Tanh) < 0.0
    assert held_out(0.05, 0.9, nn.Tanh) > 0.85

    model, loop, _ = regress(0.05, 0.999, nn.Tanh)
    hypothesis = watched(model, loop).hypotheses()[0]
    assert hypothesis.root.kind.value == "saturated_activations"
    assert "The optimizer's momentum=0.999 makes each step add up about 1,000 gradients" in hypothesis.explanation
    assert hypothesis.suggestion.startswith("use momentum=0.9 ")
    assert "lower the learning rate" not in hypothesis.suggestion

    model, loop, _ = regress(0.05, 0.9, nn.Tanh)
    assert not watched(model, loop).hypotheses()  # the healthy twin


def test_learning_rate_too_high_at_usual_momentum_keeps_the_learning_rate_advice() -> None:
    # ground truth: at momentum 0.9 the learning rate is the fault: 0.5 does not train, 0.05 does
    assert held_out(0.5, 0.9) < 0.3 and held_out(0.05, 0.9) > 0.85

    model, loop, _ = regress(0.5, 0.9)
    hypothesis = watched(model, loop).hypotheses()[0]
    assert hypothesis.root.kind.value == "dead_neurons"
    assert hypothesis.suggestion.startswith("lower the learning rate (now 0.5) or clip gradients")
    assert "momentum" not in hypothesis.explanation
