"""Tabular classification with a loop that draws its batches at random from a fixed table (``torch.randint`` indices,
as many scripts do instead of a DataLoader): an MLP on 16 numeric columns and 10 classes, Adam, 300 steps of 64
drawn from 2,000 rows, so every row is seen about ten times. Its faults are those of the data and of the loop:
labels taken apart from their rows, or random; a head and a body with an optimizer each, one ``zero_grad`` left out;
a learning rate too high; small batches.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from .. import data
from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything
from ._common import accuracy

FAMILY = "tabular"
ROWS, HELD_OUT, COLUMNS, CLASSES = 2000, 1000, 16, 10


def table(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of standard-normal columns labelled by a fixed two-layer teacher (learnable, not linear)."""
    g = torch.Generator().manual_seed(data.DATA_SEED)
    w1 = torch.randn(COLUMNS, 32, generator=g)
    w2 = torch.randn(32, CLASSES, generator=g)
    x = torch.randn(n, COLUMNS, generator=g)
    return x, (torch.tanh(x @ w1 / 4) @ w2).argmax(dim=1)


def tabular_train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    x, y = table(ROWS + HELD_OUT)
    x_train, y_train, x_test, y_test = x[:ROWS], y[:ROWS], x[ROWS:], y[ROWS:]
    if hp.labels == "shuffled":  # the label column sorted apart from the rows
        y_train = y_train[torch.randperm(ROWS, generator=torch.Generator().manual_seed(7))]
    elif hp.labels == "random":
        y_train = torch.randint(0, CLASSES, (ROWS,), generator=torch.Generator().manual_seed(8))
    body = nn.Sequential(nn.Linear(COLUMNS, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
    head = nn.Linear(128, CLASSES)
    model = nn.Sequential(body, head)
    if hp.two_optimizers:
        optimizers = [torch.optim.Adam(body.parameters(), lr=hp.lr), torch.optim.Adam(head.parameters(), lr=hp.lr)]
    else:
        optimizers = [torch.optim.Adam(model.parameters(), lr=hp.lr)]
    g = torch.Generator().manual_seed(hp.seed + 11)
    with session.watch(model):
        for _step in range(hp.steps):
            i = torch.randint(0, ROWS, (hp.batch_size,), generator=g)
            loss = F.cross_entropy(model(x_train[i]), y_train[i])
            loss.backward()
            for opt in optimizers:
                opt.step()
            for k, opt in enumerate(optimizers):
                if not (hp.forget_body_zero_grad and k == 0):  # the body's reset left out
                    opt.zero_grad()
            session.record(loss)
    return {"metric": accuracy(model, x_test, y_test)}


TABULAR = Program(
    family=FAMILY,
    name="tabular_sampler",
    train=tabular_train,
    defaults=dict(
        lr=3e-3,
        batch_size=64,
        steps=300,
        labels="true",
        two_optimizers=False,
        forget_body_zero_grad=False,
    ),
    metric="accuracy",
    higher_is_better=True,
    floor=0.03,
    chance=0.1,
    variants=(
        healthy("16-128-128-10 MLP, Adam 3e-3, 300 batches of 64 drawn with replacement from 2,000 rows"),
        Variant(
            "labels_shuffled",
            "labels",
            "the label column permuted apart from the rows",
            {"labels": "shuffled"},
            K.WRONG_LABELS,
        ),
        Variant("labels_random", "labels", "random labels", {"labels": "random"}, K.WRONG_LABELS),
        Variant(
            "body_zero_grad_forgotten",
            "zero_grad",
            "a body and a head with an Adam each; zero_grad() called on the head's only",
            {"two_optimizers": True, "forget_body_zero_grad": True},
            K.NO_ZERO_GRAD,
        ),
        Variant("lr_high", "learning_rate", "Adam lr 0.05", {"lr": 0.05}, K.LR_FAR_TOO_HIGH),
        Variant("batch_8", "batch_size", "batches of 8 instead of 64", {"batch_size": 8}, K.CAPACITY),
    ),
)

PROGRAMS = [TABULAR]
