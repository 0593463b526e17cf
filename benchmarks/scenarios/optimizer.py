"""Optimizer set-up faults: parameters left out of the optimizer or given lr 0, and learning rates too small
to move the weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import _common as c
from .base import Run, Scenario


class _FunctionalMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def _left_out() -> Run:
    torch.manual_seed(70)
    model = _FunctionalMLP()
    opt = torch.optim.SGD([*model.fc1.parameters(), *model.fc3.parameters()], lr=0.05, momentum=0.9)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.classification(20, 4, 64, seed=700), steps=60)


def _head_replaced() -> Run:
    torch.manual_seed(71)
    model = c.SmallCNN(classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.fc = nn.Linear(32, 4)  # new 4-class head, swapped in after the optimizer was built
    return Run(model, [opt], nn.CrossEntropyLoss(), c.images(3, 8, 4, 32, seed=701), steps=40)


def _lr_zero_group() -> Run:
    torch.manual_seed(72)
    model = c.TinyTransformer(8, 32, 3)
    rest = [p for name, p in model.named_parameters() if not name.startswith("embed.")]
    opt = torch.optim.AdamW([{"params": model.embed.parameters(), "lr": 0.0}, {"params": rest}], lr=3e-3)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.sequences(8, 10, 3, 32, seed=702), steps=40)


def _sgd_tiny_lr() -> Run:
    torch.manual_seed(73)
    model = c.mlp([20, 64, 64, 4])
    opt = torch.optim.SGD(model.parameters(), lr=1e-7)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.classification(20, 4, 64, seed=703), steps=40)


def _adam_tiny_lr() -> Run:
    torch.manual_seed(74)
    model = c.RecurrentClassifier(8, 32, 3, cell="lstm")
    opt = torch.optim.Adam(model.parameters(), lr=1e-8)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.sequences(8, 12, 3, 32, seed=704), steps=40)


def _schedule_to_zero() -> Run:
    torch.manual_seed(75)
    model = c.SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def schedule(o: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        return torch.optim.lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=30)

    return Run(
        model,
        [opt],
        nn.CrossEntropyLoss(),
        c.images(3, 8, 4, 32, seed=705),
        steps=60,
        loop=c.scheduler_loop(schedule),
    )


SCENARIOS = [
    Scenario(
        name="frozen_layer_left_out_of_optimizer",
        arch="mlp",
        description="An MLP (functional F.relu) whose optimizer was built from fc1 and fc3 only: fc2 "
        "receives gradients but is never updated.",
        truth=c.truth(
            ["frozen_parameters"],
            roots=["fc2"],
            onset=(0, 2),
            evidence="fc2's weights are bit-identical at every step although its gradient is non-zero; "
            "fc1 and fc3 change every step",
        ),
        build=_left_out,
    ),
    Scenario(
        name="frozen_head_replaced_after_optimizer",
        arch="cnn",
        description="A CNN whose classifier head was replaced after the optimizer had been built, so the new "
        "head's parameters are not in any optimizer.",
        truth=c.truth(
            ["frozen_parameters"],
            roots=["fc"],
            onset=(0, 2),
            evidence="fc is bit-identical at every step with a non-zero gradient; the backbone changes",
        ),
        build=_head_replaced,
    ),
    Scenario(
        name="frozen_lr_zero_param_group",
        arch="transformer",
        description="A transformer trained with AdamW whose embedding sits in a parameter group with lr=0 (a "
        "warm-up start value that nothing ever raises).",
        truth=c.truth(
            ["frozen_parameters"],
            roots=["embed"],
            onset=(0, 2),
            evidence="embed is bit-identical at every step with a non-zero gradient; the encoder and head change",
        ),
        build=_lr_zero_group,
    ),
    Scenario(
        name="stalled_sgd_lr_1e-7",
        arch="mlp",
        description="An MLP trained with SGD at lr 1e-7 (a typo for 1e-1): updates are ~1e-7 of the weights "
        "and the loss does not move.",
        truth=c.truth(
            ["stalled_updates"],
            may_also=["frozen_parameters"],
            onset=(0, 2),
            evidence="update/weight ratio ~1e-8 at every step; the loss is flat",
        ),
        build=_sgd_tiny_lr,
    ),
    Scenario(
        name="stalled_adam_lr_1e-8_lstm",
        arch="rnn",
        description="An LSTM classifier trained with Adam at lr 1e-8: every weight moves by ~1e-8 per step "
        "and the loss does not move.",
        truth=c.truth(
            ["stalled_updates"],
            may_also=["frozen_parameters"],
            onset=(0, 2),
            evidence="update/weight ratio ~1e-7 at every step; the loss is flat",
        ),
        build=_adam_tiny_lr,
    ),
    Scenario(
        name="stalled_lr_schedule_to_zero",
        arch="cnn",
        description="A CNN whose linear-decay schedule was sized for 30 epochs but is stepped every batch: "
        "the lr reaches 0 at step 30 and the last 30 steps change nothing.",
        truth=c.truth(
            ["stalled_updates"],
            may_also=["frozen_parameters"],
            onset=(28, 31),
            evidence="update/weight ratio falls linearly and is exactly 0 from step 30; every module is "
            "bit-identical from then on",
        ),
        build=_schedule_to_zero,
    ),
]
