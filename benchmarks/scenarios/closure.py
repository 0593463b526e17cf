"""Steps taken with ``optimizer.step(closure)``: Adam given a closure, and LBFGS, which calls it several times a
step (a line search). Healthy, and with a head left out of the optimizer.

Before the recorder's rewrite, updates were measured inside the closure and every one of these runs read
"stalled, no parameter changes at all"; these scenarios keep that fixed.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from . import _common as c
from .base import Run, Scenario, StepProbe


def closure_loop(run: Run, probe: StepProbe | None) -> None:
    """``optimizer.step(closure)`` every step; the probe sees the first evaluation of each step (the gradients
    the step starts from), before the optimizer changes anything."""
    for step in range(run.steps):
        run.optimizers[0].step(partial(_evaluate, run, step, probe, [0]))


def _evaluate(run: Run, step: int, probe: StepProbe | None, calls: list[int]) -> torch.Tensor:
    """The closure: zero the gradients, forward, backward, return the loss."""
    run.optimizers[0].zero_grad()
    inputs, targets = run.batch(step)
    loss = run.loss_fn(run.model(inputs), targets)
    loss.backward()
    if calls[0] == 0 and probe is not None:
        probe(step, run.model, loss.detach())
    calls[0] += 1
    return loss


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def full_batch(batch: c.BatchFn) -> c.BatchFn:
    """The same batch at every step: LBFGS is a full-batch method."""
    fixed = batch(0)
    return lambda step: fixed


def _adam_closure() -> Run:
    torch.manual_seed(500)
    model = Classifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return Run(model, [opt], F.cross_entropy, c.classification(20, 4, 64, seed=5000), steps=60, loop=closure_loop)


def _lbfgs() -> Run:
    torch.manual_seed(501)
    model = c.mlp([8, 32, 32, 1], act=nn.Tanh)
    opt = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=5, history_size=10, line_search_fn="strong_wolfe")
    return Run(model, [opt], F.mse_loss, full_batch(c.regression(8, 1, 128, seed=5001)), steps=15, loop=closure_loop)


def _head_left_out() -> Run:
    torch.manual_seed(502)
    model = Classifier()
    opt = torch.optim.Adam(model.body.parameters(), lr=1e-3)  # the head was forgotten
    return Run(model, [opt], F.cross_entropy, c.classification(20, 4, 64, seed=5002), steps=40, loop=closure_loop)


SCENARIOS = [
    Scenario(
        name="healthy_adam_closure_step",
        arch="mlp",
        description="An MLP classifier trained with Adam through optimizer.step(closure), the closure running the "
        "forward and backward pass.",
        truth=c.HEALTHY,
        build=_adam_closure,
    ),
    Scenario(
        name="healthy_lbfgs_full_batch",
        arch="mlp",
        description="A tanh regressor fitted with LBFGS (strong Wolfe line search, up to 5 closure calls a step) on "
        "one full batch.",
        truth=c.HEALTHY,
        build=_lbfgs,
    ),
    Scenario(
        name="frozen_head_left_out_of_closure_optimizer",
        arch="mlp",
        description="The MLP classifier trained through optimizer.step(closure) by an Adam built from the body's "
        "parameters only: the head gets gradients and never moves.",
        truth=c.truth(
            ["frozen_parameters"],
            roots=["head"],
            onset=(0, 0),
            evidence="the head's weight and bias never change while their gradient norms are ~0.1-1; every body "
            "layer moves at every step",
        ),
        build=_head_left_out,
    ),
]
