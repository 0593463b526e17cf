"""A small classifier and a synthetic data set it can learn: ordinary user code, nothing NeuralDBG-specific."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 8
CLASSES = 3


def build_model(hidden: int = 32, *, broken: bool = False) -> nn.Sequential:
    """An MLP classifier: FEATURES inputs -> two ReLU hidden layers -> CLASSES logits.

    ``broken=True`` reproduces a classic initialisation bug: the second hidden layer's bias starts at -20,
    so every pre-activation of its ReLU is negative, the ReLU outputs zeros and passes no gradient back.
    The loss still goes down a little (the output bias trains), so the bug is easy to miss by eye.
    """
    second = nn.Linear(hidden, hidden)
    if broken:
        with torch.no_grad():
            second.bias.fill_(-20.0)
    return nn.Sequential(
        nn.Linear(FEATURES, hidden),
        nn.ReLU(),
        second,
        nn.ReLU(),
        nn.Linear(hidden, CLASSES),
    )


def make_data(samples: int = 256, batch_size: int = 32, seed: int = 0) -> DataLoader[tuple[torch.Tensor, ...]]:
    """Labels from a fixed random linear "teacher": a learnable, deterministic classification task."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    labels = (inputs @ teacher).argmax(dim=1)
    return DataLoader(
        TensorDataset(inputs, labels),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
