"""Forward-forward training (Hinton 2022), shaped like pytorch/examples' mnist_forward_forward.

The network keeps its layers in a plain Python list (so ``net.parameters()`` is empty), each layer is an
``nn.Linear`` subclass with its own Adam optimizer and a local loss: softplus of (threshold - goodness) on
positive data (the image with its label overlaid on the first pixels) and of (goodness - threshold) on negative
data (a wrong label). Layers are trained one after the other, full batch; prediction picks the label whose
overlay gives the most goodness summed over layers.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything
from ._common import image_split, to_input


def overlay_y_on_x(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x_ = x.clone()
    x_[:, :10] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


class Layer(nn.Linear):
    def __init__(self, in_features: int, out_features: int, hp: SimpleNamespace) -> None:
        super().__init__(in_features, out_features)
        self.relu = nn.ReLU()
        self.opt = torch.optim.Adam(self.parameters(), lr=hp.lr)
        self.threshold = 2.0
        self.num_epochs = hp.epochs
        self.zero_grad_each_step = hp.zero_grad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def fit(self, x_pos: torch.Tensor, x_neg: torch.Tensor, session: Session) -> tuple[torch.Tensor, torch.Tensor]:
        for _ in range(self.num_epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log(1 + torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))).mean()
            if self.zero_grad_each_step:
                self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            session.record(loss)
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()


class Net(nn.Module):
    def __init__(self, dims: list[int], hp: SimpleNamespace) -> None:
        super().__init__()
        self.layers = []
        for d in range(len(dims) - 1):
            self.layers += [Layer(dims[d], dims[d + 1], hp)]

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        goodness_per_label = []
        for label in range(10):
            h = overlay_y_on_x(x, torch.full((len(x),), label))
            goodness = []
            for layer in self.layers:
                h = layer(h)
                goodness += [h.pow(2).mean(1)]
            goodness_per_label += [sum(goodness).unsqueeze(1)]
        return torch.cat(goodness_per_label, 1).argmax(1)

    def fit(self, x_pos: torch.Tensor, x_neg: torch.Tensor, session: Session) -> None:
        h_pos, h_neg = x_pos, x_neg
        for layer in self.layers:
            h_pos, h_neg = layer.fit(h_pos, h_neg, session)


def train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    x_train, y_train, x_test, y_test = image_split(2048, 1024)
    x_train, x_test = to_input(x_train).flatten(1), to_input(x_test).flatten(1)
    net = Net([256, 128, 128], hp)
    x_pos = overlay_y_on_x(x_train, y_train)
    rnd = torch.randperm(x_train.size(0))
    x_neg = overlay_y_on_x(x_train, y_train[rnd])
    with session.watch(net, probe_also=tuple(net.layers)):
        net.fit(x_pos, x_neg, session)
    return {"metric": float((net.predict(x_test) == y_test).float().mean())}


PROGRAM = Program(
    family="forward_forward",
    name="forward_forward",
    train=train,
    defaults=dict(lr=0.03, epochs=150, zero_grad=True),
    metric="held-out accuracy",
    higher_is_better=True,
    floor=0.03,
    chance=0.1,
    variants=(
        healthy("two 128-unit layers in a Python list, each with its own Adam 0.03 and local goodness loss"),
        Variant("lr_100x", "learning_rate", "each layer's Adam lr 3.0", {"lr": 3.0}, K.LR_FAR_TOO_HIGH),
        Variant(
            "no_zero_grad", "zero_grad", "opt.zero_grad() missing in each layer", {"zero_grad": False}, K.NO_ZERO_GRAD
        ),
    ),
)

PROGRAMS = (PROGRAM,)
