"""Two normalisations in a row: the second divides the first one's per-channel scale out again and adds its shift
back, so the first one's affine weight and bias get a gradient of ~0 by construction (like a conv bias before a
BatchNorm). Healthy runs, which naive vanishing-gradient checks call broken.
"""

from __future__ import annotations

import torch
from torch import nn

from . import _common as c
from .base import Run, Scenario


def _layernorm_then_batchnorm() -> Run:
    torch.manual_seed(600)
    model = nn.Sequential(
        nn.Linear(20, 64),
        nn.LayerNorm(64),
        nn.BatchNorm1d(64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, 4),
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.classification(20, 4, 64, seed=6000), steps=60)


class _DoubleBatchNormCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn_a = nn.BatchNorm2d(16)
        self.bn_b = nn.BatchNorm2d(16)  # a second norm left in after a refactor
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu2 = nn.ReLU()
        self.fc = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn_b(self.bn_a(self.conv(x))))
        x = self.relu2(self.bn2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))


def _conv_batchnorm_twice() -> Run:
    torch.manual_seed(601)
    model = _DoubleBatchNormCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.images(3, 8, 4, 32, seed=6001), steps=40)


SCENARIOS = [
    Scenario(
        name="healthy_layernorm_then_batchnorm",
        arch="mlp",
        description="An MLP whose first hidden layer is normalised twice, LayerNorm then BatchNorm1d: the "
        "LayerNorm's affine parameters get a gradient of ~1e-6 of the largest, by construction.",
        truth=c.truth(
            evidence=f"{c.HEALTHY.evidence}; scaling the LayerNorm's weight and bias by random positive factors "
            "leaves the model's output unchanged (< 1e-4 relative)"
        ),
        build=_layernorm_then_batchnorm,
    ),
    Scenario(
        name="healthy_conv_batchnorm_twice",
        arch="cnn",
        description="A CNN whose first convolution is followed by two BatchNorm2d in a row (conv -> BN -> BN): the "
        "first BatchNorm's affine parameters get a gradient of ~1e-6 of the largest, by construction.",
        truth=c.truth(
            evidence=f"{c.HEALTHY.evidence}; scaling the first BatchNorm's weight and bias by random positive factors "
            "leaves the model's output unchanged (< 1e-4 relative)"
        ),
        build=_conv_batchnorm_twice,
    ),
]
