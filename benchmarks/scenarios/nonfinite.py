"""Non-finite values: from a poisoned input batch, from inside one layer, or from the loss."""

from __future__ import annotations

import torch
from torch import nn

from . import _common as c
from .base import Run, Scenario


def _nan_batch_mlp() -> Run:
    torch.manual_seed(60)
    model = c.mlp([20, 64, 64, 4])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = c.poisoned(c.classification(20, 4, 64, seed=600), at_step=37, value=float("nan"))
    return Run(model, [opt], nn.CrossEntropyLoss(), batches, steps=60)


def _inf_batch_cnn() -> Run:
    torch.manual_seed(61)
    model = c.SmallCNN(inplace=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = c.poisoned(c.images(3, 8, 4, 32, seed=601), at_step=25, value=float("inf"))
    return Run(model, [opt], nn.CrossEntropyLoss(), batches, steps=40)


def _nan_sequence_gru() -> Run:
    torch.manual_seed(62)
    model = c.RecurrentClassifier(8, 32, 1, cell="gru")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batches = c.poisoned(c.sequence_regression(8, 12, 32, seed=602), at_step=30, value=float("nan"))
    return Run(model, [opt], nn.MSELoss(), batches, steps=50)


class SqrtCompress(nn.Module):
    """Square-root range compression, written for non-negative inputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


def _sqrt_layer() -> Run:
    torch.manual_seed(63)
    model = nn.Sequential(nn.Linear(16, 32), SqrtCompress(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return Run(model, [opt], nn.MSELoss(), c.regression(16, 1, 32, seed=603), steps=30)


class LogVarianceHead(nn.Module):
    """Predicts a log-variance as ``log`` of a Linear output, with no positivity constraint on that output."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 1)
        nn.init.constant_(self.linear.bias, 1.0)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.log(self.linear(h))


class _HeteroscedasticResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = c.ResidualMLP(16, 32, depth=4, out_dim=32)
        self.mean = nn.Linear(32, 1)
        self.log_var = LogVarianceHead(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.trunk(x))
        return torch.cat([self.mean(h), self.log_var(h)], dim=1)


def gaussian_nll(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    mean, log_var = out[:, :1], out[:, 1:]
    return 0.5 * (log_var + (target - mean) ** 2 * torch.exp(-log_var)).mean()


def _log_variance_resnet() -> Run:
    torch.manual_seed(64)
    model = _HeteroscedasticResNet()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    return Run(model, [opt], gaussian_nll, c.linear_regression(16, 1, 32, seed=604), steps=40)


def handwritten_bce(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy written out by hand, without the clamping ``nn.BCELoss`` does."""
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()


class _BinaryTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = c.TinyTransformer(8, 32, 1, norm_first=True)
        self.prob = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.prob(self.net(x))


def _loss_log_zero() -> Run:
    torch.manual_seed(65)
    model = _BinaryTransformer()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    flat = c.binary(8, 32, seed=605, margin=1.0)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = flat(step)
        noise = torch.randn(x.shape[0], 6, 8, generator=c.generator(6050 + step)) * 0.5
        return 2.0 * (x[:, None, :] + noise), y  # six noisy views of one separable point per sample

    return Run(model, [opt], handwritten_bce, batch, steps=40)


SCENARIOS = [
    Scenario(
        name="nonfinite_nan_batch_mlp",
        arch="mlp",
        description="An MLP classifier receives one batch with a NaN feature at step 37 (a corrupt record); "
        "NaN spreads to the loss, the gradients and, after the step, every weight.",
        truth=c.truth(
            ["non_finite"],
            roots=[""],
            onset=(37, 37),
            evidence="the input of step 37 is the first non-finite value; all module outputs are finite before it",
        ),
        build=_nan_batch_mlp,
    ),
    Scenario(
        name="nonfinite_inf_batch_cnn",
        arch="cnn",
        description="A BatchNorm CNN with in-place ReLUs receives one image batch containing inf at step 25 "
        "(a division by a zero standard deviation in preprocessing).",
        truth=c.truth(
            ["non_finite"],
            roots=[""],
            onset=(25, 25),
            evidence="the input of step 25 is the first non-finite value; conv1's output is the first "
            "non-finite module output",
        ),
        build=_inf_batch_cnn,
    ),
    Scenario(
        name="nonfinite_nan_sequence_gru",
        arch="rnn",
        description="A GRU regressor receives a sequence batch with a NaN reading at step 30.",
        truth=c.truth(
            ["non_finite"],
            roots=[""],
            onset=(30, 30),
            evidence="the input of step 30 is the first non-finite value",
        ),
        build=_nan_sequence_gru,
    ),
    Scenario(
        name="nonfinite_sqrt_layer",
        arch="mlp",
        description="A custom SqrtCompress module takes torch.sqrt of a Linear output that is negative for "
        "about half the units, producing NaN inside that layer from step 0.",
        truth=c.truth(
            ["non_finite"],
            roots=["1"],
            onset=(0, 0),
            evidence="inputs and the first Linear's output are finite; module '1' (SqrtCompress) is the "
            "first module whose output is NaN, at step 0",
        ),
        build=_sqrt_layer,
    ),
    Scenario(
        name="nonfinite_log_variance_head",
        arch="resnet",
        description="A residual regressor predicts a log-variance as torch.log of a Linear output; as the "
        "fit improves the predicted variance shrinks, crosses zero for one sample mid-run, and the head "
        "emits NaN.",
        truth=c.truth(
            ["non_finite"],
            roots=["log_var"],
            onset=(20, 24),
            evidence="every input and module output is finite until step 22, when log_var.linear first "
            "goes <= 0 for a sample; log_var is then the first non-finite module output",
        ),
        build=_log_variance_resnet,
    ),
    Scenario(
        name="nonfinite_loss_log_zero",
        arch="transformer",
        description="A pre-LN transformer binary classifier trained with a hand-written BCE; once a sigmoid "
        "output rounds to exactly 1.0, 0 * log(0) makes the loss NaN although every layer output is finite.",
        truth=c.truth(
            ["non_finite"],
            roots=[""],
            onset=(22, 26),
            evidence="all inputs and module outputs are finite at step 24, the first non-finite step; "
            "only the loss is NaN",
        ),
        build=_loss_log_zero,
    ),
]
