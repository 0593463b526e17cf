"""Gradients never zeroed: ``optimizer.zero_grad()`` missing from the loop, so every step's gradient adds to all
the earlier ones and each update follows their sum; and a healthy twin that zeroes in another legitimate way."""

from __future__ import annotations

import torch
from torch import nn

from . import _common as c
from .base import Run, Scenario, StepProbe


def never_zeroed_loop(run: Run, probe: StepProbe | None) -> None:
    """forward, backward, step: no zero_grad anywhere, so .grad holds the sum of every step's gradient."""
    for step in range(run.steps):
        inputs, targets = run.batch(step)
        loss = run.loss_fn(run.model(inputs), targets)
        loss.backward()
        if probe is not None:
            probe(step, run.model, loss.detach())
        for opt in run.optimizers:
            opt.step()


def accumulate_then_clear_loop(micro_batches: int) -> c.Loop:
    """Gradient accumulation done right: ``micro_batches`` backward passes, one step, then ``p.grad = None`` on
    every parameter (no optimizer.zero_grad() call at all)."""

    def loop(run: Run, probe: StepProbe | None) -> None:
        for step in range(run.steps):
            inputs, targets = run.batch(step)
            total = torch.zeros(())
            for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches), strict=True):
                loss = run.loss_fn(run.model(x), y) / micro_batches
                loss.backward()
                total += loss.detach()
            if probe is not None:
                probe(step, run.model, total)
            for opt in run.optimizers:
                opt.step()
            for p in run.model.parameters():
                p.grad = None

    return loop


def _mlp_sgd(loop: c.Loop) -> Run:
    torch.manual_seed(1201)
    model = c.mlp([16, 64, 64, 2])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Run(model, [opt], nn.MSELoss(), c.regression(16, 2, 64, seed=1201), steps=60, loop=loop)


def _missing_mlp_sgd() -> Run:
    return _mlp_sgd(never_zeroed_loop)


def _healthy_accumulate_mlp_sgd() -> Run:
    return _mlp_sgd(accumulate_then_clear_loop(4))


def _missing_cnn_sgd_momentum() -> Run:
    torch.manual_seed(1202)
    model = c.SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.images(3, 8, 4, 32, seed=1202), steps=60, loop=never_zeroed_loop)


SCENARIOS = [
    Scenario(
        name="zerograd_missing_mlp_sgd",
        arch="mlp",
        description="A ReLU regression MLP trained with plain SGD at lr 0.1 whose loop never calls "
        "optimizer.zero_grad(): each update follows the sum of every gradient so far, and the loss stops falling.",
        truth=c.truth(
            ["gradients_not_zeroed"],
            may_also=["dead_neurons"],
            roots=[""],
            onset=(1, 1),
            evidence="from step 1 on, every parameter's .grad at the start of the backward pass equals (exactly) the "
            "gradient the optimizer applied at the previous step although the weights changed since; the loss "
            "ends at 0.89 of its start, against 0.14 for the same run with zero_grad() in the loop; the oversized "
            "updates leave the second ReLU layer >= 50% dead from step 40",
        ),
        build=_missing_mlp_sgd,
    ),
    Scenario(
        name="zerograd_missing_cnn_sgd_momentum",
        arch="cnn",
        description="A BatchNorm CNN classifier trained with SGD and momentum 0.9 whose loop never calls "
        "optimizer.zero_grad(): the accumulated gradient drives the updates, and the loss climbs after step 12.",
        truth=c.truth(
            ["gradients_not_zeroed"],
            roots=[""],
            onset=(1, 1),
            evidence="from step 1 on, every parameter's .grad at the start of the backward pass equals (exactly) the "
            "gradient applied at the previous step although the weights changed since; the loss rises to ~50x "
            "its start, while the same run with zero_grad() in the loop ends at 0.02 of it",
        ),
        build=_missing_cnn_sgd_momentum,
    ),
    Scenario(
        name="healthy_accumulate_then_grad_none_mlp",
        arch="mlp",
        description="The same regression MLP and SGD, each step accumulating four micro-batches, stepping once and "
        "then clearing every p.grad to None itself (no optimizer.zero_grad() call).",
        truth=c.truth(
            evidence=f"{c.HEALTHY.evidence}; no backward pass starts from a gradient the optimizer already applied"
        ),
        build=_healthy_accumulate_mlp_sgd,
    ),
]
