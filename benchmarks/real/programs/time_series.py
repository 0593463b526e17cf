"""Time-series regression: a GRU with LayerNorm predicting the next value of a noisy sum of sinusoids.

The common forecasting script: windows of 30 steps, a 1-layer GRU, LayerNorm on its last hidden state, a Linear
head, MSE, Adam 3e-3 with a batch of 64.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from .. import data
from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything
from ._common import loader


class Forecaster(nn.Module):
    def __init__(self, hidden: int = 32, layer_norm: bool = True, squeeze: bool = True) -> None:
        super().__init__()
        self.squeeze = squeeze
        self.gru = nn.GRU(1, hidden, batch_first=True)
        self.norm = nn.LayerNorm(hidden) if layer_norm else nn.Identity()
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x.unsqueeze(-1))
        prediction = self.head(self.norm(out[:, -1]))
        return prediction.squeeze(-1) if self.squeeze else prediction


def train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    series = data.sine_series(2560, 31) * hp.input_scale
    x, y = series[:, :30], series[:, 30]
    x_train, y_train, x_test, y_test = x[:2048], y[:2048], x[2048:], y[2048:]
    model = Forecaster(layer_norm=hp.layer_norm, squeeze=hp.squeeze)
    optimizer = torch.optim.Adam(model.parameters(), lr=hp.lr)
    criterion = nn.MSELoss()
    with session.watch(model):
        for _epoch in range(hp.epochs):
            for xb, yb in loader(x_train, y_train, 64):
                if hp.zero_grad:
                    optimizer.zero_grad()
                loss = criterion(model(xb), yb)
                loss.backward()
                optimizer.step()
                session.record(loss)
    with torch.no_grad():  # held-out MSE in the data's own units
        return {"metric": float(criterion(model(x_test).reshape(-1), y_test)) / hp.input_scale**2}


PROGRAM = Program(
    family="time_series",
    name="gru_forecaster",
    train=train,
    defaults=dict(lr=3e-3, epochs=4, layer_norm=True, input_scale=1.0, zero_grad=True, squeeze=True),
    metric="held-out MSE",
    higher_is_better=False,
    floor=0.1,
    relative_floor=True,
    chance=0.43,  # the variance of the target
    variants=(
        healthy("GRU(1->32), LayerNorm, Linear; MSE, Adam 3e-3"),
        Variant("lr_0.1", "learning_rate", "Adam lr 0.1", {"lr": 0.1}, K.LR_TOO_HIGH),
        Variant("layernorm_removed", "normalisation", "no LayerNorm", {"layer_norm": False}, K.CAPACITY),
        Variant(
            "unscaled_series",
            "data_normalisation",
            "series in raw units (x1000), not standardised",
            {"input_scale": 1000.0},
            K.RAW_INPUTS | {"saturated_activations"},
        ),
        Variant("no_zero_grad", "zero_grad", "optimizer.zero_grad() missing", {"zero_grad": False}, K.NO_ZERO_GRAD),
        Variant(
            "output_not_squeezed",
            "loss_function",
            "the head's (N, 1) output given to MSELoss with (N,) targets (the .squeeze(-1) forgotten)",
            {"squeeze": False},
            K.BROADCAST,
        ),
    ),
)

PROGRAMS = (PROGRAM,)
