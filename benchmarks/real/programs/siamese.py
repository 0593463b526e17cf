"""Siamese network deciding whether two images show the same class (pytorch/examples' siamese_network).

A shared convolutional tower (standing in for the examples' ResNet-18, which torchvision would provide), the two
embeddings concatenated into an MLP head with a sigmoid, Xavier initialisation with bias 0.01, BCELoss,
Adadelta lr 1 and a StepLR; pairs are drawn half same-class, half different-class.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything
from ._common import image_split, to_input


class SiameseNetwork(nn.Module):
    def __init__(self, head: str = "sigmoid") -> None:
        super().__init__()
        self.head = head
        self.tower = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(2),
        )
        self.fc = nn.Sequential(nn.Linear(32 * 4 * 2, 64), nn.ReLU(inplace=True), nn.Linear(64, 1))
        self.sigmoid = nn.Sigmoid()
        self.fc.apply(self.init_weights)

    def init_weights(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            torch.nn.init.xavier_uniform_(m.weight)
            m.bias.data.fill_(0.01)

    def forward_once(self, x: torch.Tensor) -> torch.Tensor:
        return self.tower(x).view(x.size(0), -1)

    def forward(self, input1: torch.Tensor, input2: torch.Tensor) -> torch.Tensor:
        output = torch.cat((self.forward_once(input1), self.forward_once(input2)), 1)
        scores = self.fc(output)
        if self.head == "clamp":  # the sigmoid dropped, and BCELoss's refusal of values outside [0, 1] silenced
            return scores.clamp(1e-7, 1 - 1e-7)
        return self.sigmoid(scores)


def make_pairs(labels: torch.Tensor, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index pairs, half of the same class (target 1), half of different classes (target 0)."""
    g = torch.Generator().manual_seed(seed)
    by_class = [torch.nonzero(labels == c).flatten() for c in range(10)]
    first, second, target = [], [], []
    for i in range(n):
        a = int(torch.randint(len(labels), (1,), generator=g))
        same = i % 2 == 0
        pool = by_class[int(labels[a])] if same else torch.nonzero(labels != labels[a]).flatten()
        b = int(pool[torch.randint(len(pool), (1,), generator=g)])
        first.append(a)
        second.append(b)
        target.append(1.0 if same else 0.0)
    return torch.tensor(first), torch.tensor(second), torch.tensor(target)


def train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    x_train, y_train, x_test, y_test = image_split(2048, 1024)
    x_train, x_test = to_input(x_train), to_input(x_test)
    first, second, target = make_pairs(y_train, 2048, 5)
    if hp.pair_labels == "random":  # targets computed from a different array than the pairs
        target = target[torch.randperm(len(target), generator=torch.Generator().manual_seed(8))]
    model = SiameseNetwork(hp.head)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=hp.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    criterion = nn.BCELoss()
    with session.watch(model):
        for _epoch in range(hp.epochs):
            model.train()
            order = torch.randperm(len(target))
            for start in range(0, len(order), hp.batch_size):
                idx = order[start : start + hp.batch_size]
                images_1, images_2, targets = x_train[first[idx]], x_train[second[idx]], target[idx]
                optimizer.zero_grad()
                outputs = model(images_1, images_2).squeeze(1)
                loss = criterion(outputs, targets)
                loss.backward()
                optimizer.step()
                session.record(loss)
            scheduler.step()
    model.eval()
    a, b, t = make_pairs(y_test, 1024, 6)
    with torch.no_grad():
        pred = (model(x_test[a], x_test[b]).squeeze(1) > 0.5).float()
    return {"metric": float((pred == t).float().mean())}


PROGRAM = Program(
    family="siamese",
    name="siamese",
    train=train,
    defaults=dict(lr=1.0, batch_size=64, epochs=6, pair_labels="true", head="sigmoid"),
    metric="held-out pair accuracy",
    higher_is_better=True,
    floor=0.03,
    chance=0.5,
    variants=(
        healthy("shared Conv-BN-ReLU tower, concatenated embeddings, MLP head, sigmoid + BCELoss, Adadelta 1.0"),
        Variant(
            "pair_labels_random",
            "labels",
            "pair targets shuffled apart from the pairs",
            {"pair_labels": "random"},
            K.WRONG_LABELS,
        ),
        Variant("lr_100x", "learning_rate", "Adadelta lr 100", {"lr": 100.0}, K.LR_FAR_TOO_HIGH),
        Variant(
            "sigmoid_clamped",
            "loss_function",
            "the head's sigmoid replaced by a clamp into [0, 1] (BCELoss on raw scores)",
            {"head": "clamp"},
            K.BCE_ON_SCORES,
            ("fc.2",),
        ),
    ),
)

PROGRAMS = (PROGRAM,)
