"""Built-in demonstrations: small, deliberately broken training runs the engine diagnoses in seconds.

Each demo is a plain PyTorch loop wrapped in :class:`~neuraldbg.NeuralDbg`, seeded so the output is the same
on every machine. ``neuraldbg demo`` runs the default one; ``neuraldbg demo --all`` runs them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from .debugger import NeuralDbg
from .events import FailureKind


@dataclass(frozen=True)
class Demo:
    name: str
    story: str  # what is broken, in one sentence
    expected: FailureKind | None  # None: the run is healthy and must stay silent
    expected_layer: str | None
    run: Callable[[], NeuralDbg]


def _mlp(width: int = 64, depth: int = 4) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(16, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def _train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    steps: int = 60,
    poison_step: int | None = None,
    lr_jump: tuple[int, float] | None = None,
) -> NeuralDbg:
    data = torch.Generator().manual_seed(1)
    teacher = torch.randn(16, 1, generator=data)
    with NeuralDbg(model) as dbg:
        for step in range(steps):
            inputs = torch.randn(64, 16, generator=data)
            targets = inputs @ teacher + 0.1 * torch.randn(64, 1, generator=data)
            if step == poison_step:
                inputs[3, 5] = float("nan")  # a corrupt sample in the batch
            if lr_jump is not None and step == lr_jump[0]:
                for group in optimizer.param_groups:
                    group["lr"] = lr_jump[1]
            optimizer.zero_grad()
            loss = F.mse_loss(model(inputs), targets)
            loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch
            optimizer.step()
    return dbg


def dead_layer() -> NeuralDbg:
    torch.manual_seed(0)
    model = _mlp()
    with torch.no_grad():
        cast(nn.Linear, model[4]).bias.fill_(-20.0)  # every pre-activation of the third hidden layer is negative
    return _train(model, torch.optim.Adam(model.parameters(), lr=1e-3))


def learning_rate() -> NeuralDbg:
    torch.manual_seed(0)
    model = _mlp()
    return _train(model, torch.optim.SGD(model.parameters(), lr=0.01), lr_jump=(30, 3.0))


def saturated() -> NeuralDbg:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 64),
        nn.Tanh(),
        nn.Linear(64, 64),
        nn.Tanh(),
        nn.Linear(64, 64),
        nn.Tanh(),
        nn.Linear(64, 1),
    )
    with torch.no_grad():
        cast(nn.Linear, model[0]).weight.mul_(25.0)  # inputs of the first tanh are far outside its linear range
    return _train(model, torch.optim.SGD(model.parameters(), lr=0.01))


def bad_batch() -> NeuralDbg:
    torch.manual_seed(0)
    model = _mlp()
    return _train(model, torch.optim.Adam(model.parameters(), lr=1e-3), poison_step=25)


def frozen() -> NeuralDbg:
    torch.manual_seed(0)
    model = _mlp()
    optimizer = torch.optim.Adam(model[2:].parameters(), lr=1e-3)  # the first layer was left out
    return _train(model, optimizer)


def healthy() -> NeuralDbg:
    torch.manual_seed(0)
    model = _mlp()
    return _train(model, torch.optim.Adam(model.parameters(), lr=1e-3))


DEMOS: dict[str, Demo] = {
    d.name: d
    for d in (
        Demo(
            "dead",
            "a bias initialised to -20 kills the ReLU after layer '4'",
            FailureKind.DEAD_NEURONS,
            "5",
            dead_layer,
        ),
        Demo(
            "learning-rate",
            "the learning rate jumps from 0.01 to 3 at step 30",
            FailureKind.EXPLODING_GRADIENTS,
            None,
            learning_rate,
        ),
        Demo(
            "saturated",
            "weights 25x too large drive the first tanh into saturation",
            FailureKind.SATURATED_ACTIVATIONS,
            "1",
            saturated,
        ),
        Demo("bad-batch", "one sample of the batch at step 25 is NaN", FailureKind.NON_FINITE, "", bad_batch),
        Demo(
            "frozen",
            "the optimizer was built without the first layer",
            FailureKind.FROZEN_PARAMETERS,
            "0",
            frozen,
        ),
        Demo("healthy", "the same MLP, trained correctly", None, None, healthy),
    )
}
DEFAULT = "dead"
