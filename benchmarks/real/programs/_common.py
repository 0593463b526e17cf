"""Small helpers the programs share: the image data as a torchvision pipeline would give it, and evaluation."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from .. import data


def image_split(
    n_train: int, n_test: int, classes: int = 10, size: int = 16, channels: int = 1, noise: float = 0.35
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """uint8 pixels and labels, split into a training and a held-out part."""
    pixels, labels = data.images(n_train + n_test, classes, size, channels, noise)
    return pixels[:n_train], labels[:n_train], pixels[n_train:], labels[n_train:]


def to_input(pixels: torch.Tensor, raw: bool = False) -> torch.Tensor:
    """``ToTensor()`` then ``Normalize(mean, std)`` with the training set's statistics (computed once for the
    data, like MNIST's 0.1307 / 0.3081); ``raw`` keeps the 0-255 values (the bug)."""
    x = pixels.float()
    if raw:
        return x
    x = x / 255.0
    return (x - 0.27) / 0.30


def loader(x: torch.Tensor, y: torch.Tensor, batch_size: int, shuffle: bool = True) -> DataLoader:
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, predict=None) -> float:  # type: ignore[no-untyped-def]
    """Held-out accuracy in eval mode; ``predict`` maps the model's output to class indices (argmax)."""
    was_training = model.training
    model.eval()
    out = model(x)
    pred = predict(out) if predict is not None else out.argmax(dim=-1)
    model.train(was_training)
    return float((pred == y).float().mean())
