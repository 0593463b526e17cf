"""Healthy runs, many of them chosen because naive detectors raise false alarms on them."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from . import _common as c
from .base import Run, Scenario


def _tiny() -> Run:
    torch.manual_seed(0)
    model = c.tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return Run(model, [opt], nn.MSELoss(), c.linear_regression(10, 1, 32, seed=100), steps=80)


def _inplace_dropout() -> Run:
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Linear(20, 64),
        nn.ReLU(inplace=True),
        nn.Dropout(0.1),
        nn.Linear(64, 64),
        nn.ReLU(inplace=True),
        nn.Dropout(0.1),
        nn.Linear(64, 4),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.classification(20, 4, 64, seed=101), steps=80)


def _deep_residual() -> Run:
    torch.manual_seed(2)
    model = c.ResidualMLP(16, 32, depth=16, out_dim=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return Run(model, [opt], nn.MSELoss(), c.regression(16, 1, 32, seed=102), steps=60)


def _cnn_bias_before_bn() -> Run:
    torch.manual_seed(3)
    model = c.SmallCNN(conv_bias=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.images(3, 8, 4, 32, seed=103), steps=50)


def _lstm() -> Run:
    torch.manual_seed(4)
    model = c.RecurrentClassifier(8, 32, 3, cell="lstm")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.sequences(8, 12, 3, 32, seed=104), steps=80)


def _gru() -> Run:
    torch.manual_seed(5)
    model = c.RecurrentClassifier(8, 32, 1, cell="gru")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)
    return Run(model, [opt], nn.MSELoss(), c.sequence_regression(8, 12, 32, seed=105), steps=80)


def _transformer() -> Run:
    torch.manual_seed(6)
    model = c.TinyTransformer(8, 32, 3, dropout=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.sequences(8, 10, 3, 32, seed=106), steps=60)


class _SparseNet(nn.Module):
    """A wide ReLU layer biased so that most activations are zero, in the spirit of sparse coding."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(20, 256)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(256, 4)
        nn.init.constant_(self.fc1.bias, -0.8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


def _sparse() -> Run:
    torch.manual_seed(7)
    model = _SparseNet()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.classification(20, 4, 64, seed=107), steps=80)


def _adam_1e4() -> Run:
    torch.manual_seed(8)
    model = c.mlp([32, 128, 128, 1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    return Run(model, [opt], nn.MSELoss(), c.regression(32, 1, 64, seed=108, bias=1.0), steps=150)


def _adam_3e5() -> Run:
    torch.manual_seed(9)
    model = c.mlp([64, 512, 512, 1])
    opt = torch.optim.Adam(model.parameters(), lr=3e-5)
    return Run(model, [opt], nn.MSELoss(), c.regression(64, 1, 64, seed=109, bias=1.0), steps=150)


def _tanh_xavier() -> Run:
    torch.manual_seed(10)
    model = c.mlp([16, 64, 64, 1], act=nn.Tanh)
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight, gain=nn.init.calculate_gain("tanh"))
            nn.init.zeros_(m.bias)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    return Run(model, [opt], nn.MSELoss(), c.regression(16, 1, 32, seed=110), steps=80)


def _sigmoid_bce() -> Run:
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return Run(model, [opt], nn.BCELoss(), c.binary(10, 64, seed=111, margin=1.5), steps=100)


def _grad_accumulation() -> Run:
    torch.manual_seed(12)
    model = c.SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return Run(
        model,
        [opt],
        nn.CrossEntropyLoss(),
        c.images(3, 8, 4, 64, seed=112),
        steps=30,
        loop=c.accumulation_loop(4),
    )


class _EncoderHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def _two_optimizers() -> Run:
    torch.manual_seed(13)
    model = _EncoderHead()
    opts: list[torch.optim.Optimizer] = [
        torch.optim.SGD(model.encoder.parameters(), lr=0.05, momentum=0.9),
        torch.optim.Adam(model.head.parameters(), lr=1e-2),
    ]
    return Run(model, opts, nn.CrossEntropyLoss(), c.classification(20, 4, 64, seed=113), steps=80)


class _FineTune(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def _finetune() -> Run:
    torch.manual_seed(14)
    model = _FineTune()
    for p in model.backbone.parameters():
        p.requires_grad = False
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.images(3, 8, 4, 32, seed=114), steps=60)


def _fast_convergence() -> Run:
    torch.manual_seed(15)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 1))  # a linear regressor with a linear bottleneck
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    return Run(model, [opt], nn.MSELoss(), c.linear_regression(8, 1, 32, seed=115), steps=60)


def _s(name: str, arch: str, description: str, build: Callable[[], Run]) -> Scenario:
    return Scenario(name=name, arch=arch, description=description, truth=c.HEALTHY, build=build)


SCENARIOS = [
    _s(
        "healthy_tiny_readme",
        "tiny",
        "The README model on a linear regression task with plain SGD; nothing is wrong.",
        _tiny,
    ),
    _s(
        "healthy_mlp_inplace_relu_dropout",
        "mlp",
        "An MLP with nn.ReLU(inplace=True) and Dropout trained with "
        "SGD and momentum; dropout zeroes values but no unit is dead.",
        _inplace_dropout,
    ),
    _s(
        "healthy_deep_residual_layernorm",
        "resnet",
        "A 16-block pre-norm residual MLP with LayerNorm trained with "
        "Adam; some parameters have small gradients, which is normal for normalised nets.",
        _deep_residual,
    ),
    _s(
        "healthy_cnn_conv_bias_before_bn",
        "cnn",
        "A CNN whose convolutions keep their bias before BatchNorm; "
        "those biases get ~0 gradient by construction, which is not a fault.",
        _cnn_bias_before_bn,
    ),
    _s("healthy_lstm_classifier", "rnn", "An LSTM sequence classifier trained with Adam.", _lstm),
    _s(
        "healthy_gru_regression",
        "rnn",
        "A GRU regressing a decaying sum of its inputs, trained with AdamW.",
        _gru,
    ),
    _s(
        "healthy_transformer_encoder",
        "transformer",
        "A two-layer nn.TransformerEncoder (batch_first) sequence classifier with dropout, trained with AdamW.",
        _transformer,
    ),
    _s(
        "healthy_sparse_relu",
        "mlp",
        "A wide ReLU layer with a negative bias keeps most activations at zero, "
        "yet every unit fires on some samples and the net learns.",
        _sparse,
    ),
    _s(
        "healthy_adam_lr_1e-4",
        "mlp",
        "An MLP trained with Adam at lr 1e-4: small steps, but the loss falls steadily.",
        _adam_1e4,
    ),
    _s(
        "healthy_adam_lr_3e-5_wide",
        "mlp",
        "A wide MLP trained with Adam at lr 3e-5: tiny per-weight steps add up and the loss falls.",
        _adam_3e5,
    ),
    _s(
        "healthy_tanh_xavier",
        "mlp",
        "A tanh MLP with Xavier initialisation (tanh gain): activations stay in the non-saturated range.",
        _tanh_xavier,
    ),
    _s(
        "healthy_sigmoid_bce_confident",
        "mlp",
        "A binary classifier ending in nn.Sigmoid with BCELoss becomes "
        "confident; its output sigmoid saturates, as it should on separable data.",
        _sigmoid_bce,
    ),
    _s(
        "healthy_grad_accumulation",
        "cnn",
        "A BatchNorm CNN trained with gradient accumulation over 4 micro-batches per optimizer step (custom loop).",
        _grad_accumulation,
    ),
    _s(
        "healthy_two_optimizers",
        "mlp",
        "An encoder trained by SGD and a head trained by Adam, two optimizers stepping two halves of one model.",
        _two_optimizers,
    ),
    _s(
        "healthy_finetune_frozen_backbone",
        "cnn",
        "Fine-tuning: the backbone is frozen on purpose with requires_grad=False and only the head is trained.",
        _finetune,
    ),
    _s(
        "healthy_fast_convergence",
        "mlp",
        "A linear regressor with a linear bottleneck fits noise-free linear targets to a loss of ~1e-12 "
        "within 30 steps; the tiny gradients and updates after that are convergence, not a fault.",
        _fast_convergence,
    ),
]
