"""Dead ReLU layers: killed from step 0 by a bias or a zero BatchNorm scale, or later by a learning-rate jump
or an outlier batch."""

from __future__ import annotations

import torch
from torch import nn

from . import _common as c
from .base import Run, Scenario

# A fully dead layer passes exactly zero gradient upstream: those layers stop moving as a consequence.
_DEAD_SIDE_EFFECTS = ("vanishing_gradients", "stalled_updates")


def _tiny_negative_bias() -> Run:
    torch.manual_seed(30)
    model = c.tiny_model()
    nn.init.constant_(model[0].bias, -5.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return Run(model, [opt], nn.MSELoss(), c.linear_regression(10, 1, 32, seed=300), steps=60)


class _SharedActMLP(nn.Module):
    """An MLP that reuses one ``self.act`` module after every hidden layer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 32)
        self.fc4 = nn.Linear(32, 4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        x = self.act(self.fc3(x))
        return self.fc4(x)


def _shared_act() -> Run:
    torch.manual_seed(31)
    model = _SharedActMLP()
    nn.init.constant_(model.fc2.bias, -3.0)  # a "closed by default" gate init applied to the wrong layer
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.classification(20, 4, 64, seed=301), steps=60)


def _bn_gamma_zero() -> Run:
    torch.manual_seed(32)
    model = c.SmallCNN()
    nn.init.zeros_(model.bn2.weight)  # the "zero-init the last BN" trick, in a net without residual connections
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.images(3, 8, 4, 32, seed=302), steps=40)


def _adam_lr_jump() -> Run:
    torch.manual_seed(20)
    model = c.mlp([20, 64, 64, 1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return Run(
        model,
        [opt],
        nn.MSELoss(),
        c.regression(20, 1, 64, seed=200),
        steps=100,
        loop=c.lr_change_loop(60, 0.1),
    )


def _cnn_lr_jump() -> Run:
    torch.manual_seed(23)
    model = c.SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return Run(
        model,
        [opt],
        nn.CrossEntropyLoss(),
        c.images(3, 8, 4, 32, seed=203),
        steps=60,
        loop=c.lr_change_loop(30, 5.0),
    )


def _transformer_lr_jump() -> Run:
    torch.manual_seed(80)
    model = c.TinyTransformer(8, 32, 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return Run(
        model,
        [opt],
        nn.CrossEntropyLoss(),
        c.sequences(8, 10, 3, 32, seed=800),
        steps=60,
        loop=c.lr_change_loop(30, 0.05),
    )


def _outlier_batch() -> Run:
    torch.manual_seed(21)
    model = c.mlp([20, 64, 64, 1])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = c.scaled_targets(c.regression(20, 1, 64, seed=201), at_step=40, factor=-300.0)
    return Run(model, [opt], nn.MSELoss(), batches, steps=80)


SCENARIOS = [
    Scenario(
        name="dead_bias_tiny",
        arch="tiny",
        description="The README model with its first Linear's bias initialised to -5: every ReLU unit is "
        "negative on every sample from step 0.",
        truth=c.truth(
            ["dead_neurons"],
            may_also=_DEAD_SIDE_EFFECTS,
            roots=["0", "1"],
            onset=(0, 0),
            evidence="ReLU '1' is 100% dead at step 0 and stays so; layer '0' gets exactly zero gradient",
        ),
        build=_tiny_negative_bias,
    ),
    Scenario(
        name="dead_shared_act_bias",
        arch="mlp",
        description="An MLP reusing one self.act ReLU after each layer; fc2's bias initialised to -3 kills "
        "the second use of act from step 0.",
        truth=c.truth(
            ["dead_neurons"],
            may_also=_DEAD_SIDE_EFFECTS,
            roots=["fc2", "act"],
            onset=(0, 0),
            evidence="the second call of the shared 'act' (after fc2) is 100% dead from step 0; fc1 and "
            "fc2 get exactly zero gradient",
        ),
        build=_shared_act,
    ),
    Scenario(
        name="dead_bn_zero_gamma_cnn",
        arch="cnn",
        description="A CNN whose second BatchNorm scale is initialised to zero without a residual path: bn2 "
        "outputs exactly 0, relu2 never fires, and nothing upstream gets gradient.",
        truth=c.truth(
            ["dead_neurons"],
            may_also=_DEAD_SIDE_EFFECTS,
            roots=["bn2", "relu2"],
            onset=(0, 0),
            evidence="relu2 is 100% dead at every step; conv1/bn1/conv2/bn2 get exactly zero gradient",
        ),
        build=_bn_gamma_zero,
    ),
    Scenario(
        name="dead_after_adam_lr_jump",
        arch="mlp",
        description="An MLP trained with Adam at lr 1e-3 whose lr is raised to 0.1 at step 60; the oversized "
        "updates push the second ReLU layer's units negative for good.",
        truth=c.truth(
            ["dead_neurons"],
            may_also=["vanishing_gradients"],
            roots=["2", "3"],
            onset=(60, 67),
            evidence="ReLU '3' goes from <=3% dead before step 60 to >=50% a few steps after the jump and "
            "ends ~95% dead; gradients stay below 1e3 and finite",
        ),
        build=_adam_lr_jump,
    ),
    Scenario(
        name="dead_after_lr_jump_cnn",
        arch="cnn",
        description="A BatchNorm CNN trained with SGD whose lr jumps from 0.05 to 5 at step 30; the second "
        "BatchNorm/ReLU stage ends with most channels dead.",
        truth=c.truth(
            ["dead_neurons"],
            may_also=["vanishing_gradients"],
            roots=["bn2", "relu2"],
            onset=(30, 38),
            evidence="relu2 is 0% dead before step 30, >=50% dead a few steps after the jump, and stays "
            "~70% dead; gradients spike but stay below 1e3",
        ),
        build=_cnn_lr_jump,
    ),
    Scenario(
        name="dead_after_outlier_batch",
        arch="mlp",
        description="An MLP regressor trained with SGD and momentum meets one corrupt batch at step 40 whose "
        "targets are -300x too large; the momentum-carried kick drives the second ReLU layer mostly dead.",
        truth=c.truth(
            ["dead_neurons"],
            may_also=["vanishing_gradients"],
            roots=["2", "3"],
            onset=(40, 48),
            evidence="one gradient spike (~6e2, below 1e3) at step 40; ReLU '3' goes from 2% dead to >=50% "
            "at step 45 and ~80% at the end",
        ),
        build=_outlier_batch,
    ),
    Scenario(
        name="dead_ffn_after_lr_jump_transformer",
        arch="transformer",
        description="A transformer classifier trained with Adam whose lr is raised from 1e-3 to 0.05 at step "
        "30; the second encoder layer's feed-forward ReLU (functional, inside nn.TransformerEncoderLayer) "
        "goes mostly dead.",
        truth=c.truth(
            ["dead_neurons"],
            may_also=["vanishing_gradients"],
            roots=["encoder.layers.1.linear1", "encoder.layers.1"],
            onset=(30, 38),
            evidence="encoder.layers.1.linear1's output is <= 0 on every sample for 0-2% of units before "
            "step 30, >=50% from a few steps after the jump, ~75% at the end; no NaN, gradients < 1e3",
        ),
        build=_transformer_lr_jump,
    ),
]
