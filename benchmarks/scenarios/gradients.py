"""Vanishing and exploding gradients: depth without normalisation, a stuck gate, a bad init, a too-high lr."""

from __future__ import annotations

import math

import torch
from torch import nn

from . import _common as c
from .base import Run, Scenario


def _deep_sigmoid() -> Run:
    torch.manual_seed(50)
    model = c.mlp([32] + [32] * 7 + [1], act=nn.Sigmoid)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Run(model, [opt], nn.MSELoss(), c.regression(32, 1, 32, seed=500), steps=60)


class _GatedGRU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 32)
        self.rnn = nn.GRU(32, 32, batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(x))
        return self.head(out[:, -1])


def _gru_stuck_update_gate() -> Run:
    torch.manual_seed(51)
    model = _GatedGRU()
    hidden = model.rnn.hidden_size
    with torch.no_grad():  # PyTorch's GRU gate order is (reset, update, new): +12 keeps the update gate at 1
        model.rnn.bias_hh_l0[hidden : 2 * hidden].fill_(12.0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.sequences(8, 12, 3, 32, seed=501), steps=50)


def _lr_too_high() -> Run:
    torch.manual_seed(52)
    model = c.mlp([20, 64, 64, 1])
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    return Run(model, [opt], nn.MSELoss(), c.regression(20, 1, 64, seed=502, bias=2.0), steps=40)


def _lr_jump_tiny() -> Run:
    torch.manual_seed(53)
    model = c.tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return Run(
        model,
        [opt],
        nn.MSELoss(),
        c.linear_regression(10, 1, 32, seed=503),
        steps=80,
        loop=c.lr_change_loop(50, 3.0),
    )


def _bad_layer_init() -> Run:
    torch.manual_seed(54)
    model = c.mlp([20, 64, 64, 64, 64, 1])
    nn.init.normal_(model[4].weight, std=math.sqrt(64))  # meant 1 / sqrt(fan_in)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return Run(model, [opt], nn.MSELoss(), c.regression(20, 1, 64, seed=504), steps=40)


SCENARIOS = [
    Scenario(
        name="vanishing_deep_sigmoid_mlp",
        arch="mlp",
        description="A plain 8-layer sigmoid MLP with default init: each layer multiplies the backward "
        "signal by <= 0.25 x its weights, so the first layers get almost no gradient.",
        truth=c.truth(
            ["vanishing_gradients"],
            may_also=["stalled_updates"],
            onset=(0, 2),
            evidence="first/last Linear gradient-norm ratio < 1e-3 from step 0; no sigmoid saturated",
        ),
        build=_deep_sigmoid,
    ),
    Scenario(
        name="vanishing_gru_stuck_update_gate",
        arch="rnn",
        description="A GRU whose update-gate bias was set to +12 (the forget-gate-bias trick overdone): the "
        "gate stays at 1, the state barely moves, and the GRU and its embedding get almost no gradient.",
        truth=c.truth(
            ["vanishing_gradients"],
            may_also=["saturated_activations"],
            roots=["rnn"],
            onset=(0, 2),
            evidence="embedding/head gradient-norm ratio < 1e-3 from step 0; the GRU's own gradient is "
            "orders of magnitude below the head's",
        ),
        build=_gru_stuck_update_gate,
    ),
    Scenario(
        name="exploding_lr_too_high_mlp",
        arch="mlp",
        description="An MLP regressor trained with SGD at lr 1.0: each step overshoots more, gradients grow "
        "geometrically and the run ends in NaN.",
        truth=c.truth(
            ["exploding_gradients"],
            may_also=["non_finite", "dead_neurons"],
            onset=(0, 5),
            evidence="total gradient norm exceeds 1e3 at step 3 and the loss is NaN by step 6; the second "
            "ReLU layer dies on the way",
        ),
        build=_lr_too_high,
    ),
    Scenario(
        name="exploding_after_lr_jump_tiny",
        arch="tiny",
        description="The README model trained with SGD at lr 0.05 until step 50, when a custom loop raises "
        "the lr to 3.0; gradients blow up within a few steps.",
        truth=c.truth(
            ["exploding_gradients"],
            may_also=["non_finite", "dead_neurons"],
            onset=(50, 56),
            evidence="gradient norm ~1 until step 50, above 1e3 a few steps after the jump",
        ),
        build=_lr_jump_tiny,
    ),
    Scenario(
        name="exploding_bad_layer_init",
        arch="mlp",
        description="A 5-layer MLP in which one Linear ('4') was initialised with std sqrt(fan_in) instead "
        "of 1/sqrt(fan_in): its outputs and every gradient around it are ~100x too large, and SGD diverges.",
        truth=c.truth(
            ["exploding_gradients"],
            may_also=["non_finite", "dead_neurons"],
            roots=["4"],
            onset=(0, 3),
            evidence="'4' has an initial gain of ~64 (others ~0.6); total gradient norm ~95 at step 0, "
            "> 1e3 at step 1, NaN by step 5",
        ),
        build=_bad_layer_init,
    ),
]
