"""Losses summed over their elements (``reduction="sum"``): large gradients that are only the loss's scale.

A loss summed over N elements has gradients N times those of its mean. Adam-like optimizers divide the scale out,
so a VAE trained with a summed reconstruction loss (the PyTorch example's way) is healthy with gradient norms in
the thousands; SGD does not, so the same scale with a learning rate meant for a mean explodes, while a learning
rate scaled down by N trains normally.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import _common as c
from .base import Batch, Run, Scenario

PIXELS = 784


def digits(batch_size: int, seed: int) -> c.BatchFn:
    """28x28 "images" in [0, 1]: one of ten fixed binary stroke patterns per sample, with random intensity and 5 %
    of the pixels flipped (what a VAE on MNIST sees, without the download)."""
    patterns = (torch.rand(10, PIXELS, generator=c.generator(seed)) > 0.7).float()

    def batch(step: int) -> Batch:
        g = c.generator(seed * 1_000_003 + step)
        x = patterns[torch.randint(0, 10, (batch_size,), generator=g)]
        x = x * (0.6 + 0.4 * torch.rand(batch_size, PIXELS, generator=g))
        flips = torch.rand(batch_size, PIXELS, generator=g) < 0.05
        x = torch.where(flips, 1 - x, x)
        return x, x

    return batch


class VAE(nn.Module):
    """The PyTorch example's VAE: 784 -> 400 -> (20, 20) -> 400 -> 784, sigmoid output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(PIXELS, 400)
        self.fc21 = nn.Linear(400, 20)
        self.fc22 = nn.Linear(400, 20)
        self.fc3 = nn.Linear(20, 400)
        self.fc4 = nn.Linear(400, PIXELS)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = F.relu(self.fc1(x))
        mu, logvar = self.fc21(h), self.fc22(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


def vae_loss(out: tuple[torch.Tensor, torch.Tensor, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Reconstruction BCE plus KL divergence, both summed over the batch (the example's ``loss_function``)."""
    recon, mu, logvar = out
    bce = F.binary_cross_entropy(recon, x, reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def tanh_autoencoder() -> nn.Sequential:
    return nn.Sequential(nn.Linear(PIXELS, 128), nn.Tanh(), nn.Linear(128, 32), nn.Tanh(), nn.Linear(32, PIXELS))


def summed_mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, target, reduction="sum")


BATCH = 32


def _vae_adam() -> Run:
    torch.manual_seed(400)
    model = VAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return Run(model, [opt], vae_loss, digits(BATCH, seed=4000), steps=40)


def _sum_sgd_scaled() -> Run:
    torch.manual_seed(401)
    model = tanh_autoencoder()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)  # 2.5 for the mean over 25,088 elements
    return Run(model, [opt], summed_mse, digits(BATCH, seed=4001), steps=40)


def _sum_sgd_too_high() -> Run:
    torch.manual_seed(402)
    model = c.mlp([20, 64, 64, 1])
    opt = torch.optim.SGD(model.parameters(), lr=0.02)  # a learning rate for the mean; x64 for this sum
    return Run(model, [opt], summed_mse, c.regression(20, 1, 64, seed=4002, bias=2.0), steps=20)


SCENARIOS = [
    Scenario(
        name="healthy_vae_summed_loss_adam",
        arch="mlp",
        description="The PyTorch example's VAE (BCE + KL summed over the batch) trained with Adam at lr 1e-3: "
        "gradient norms in the thousands, because the loss is a sum, and a normal run.",
        truth=c.truth(
            evidence=f"{c.HEALTHY.evidence}; the same run with the loss divided by its 25,088 elements (and Adam's "
            "epsilon likewise) has gradient norms below 0.1 and follows the same weights (2.6e-7 of the distance "
            "travelled): Adam is scale-invariant"
        ),
        build=_vae_adam,
    ),
    Scenario(
        name="healthy_summed_loss_sgd_scaled_lr",
        arch="mlp",
        description="A tanh autoencoder with a summed squared error trained with SGD and momentum at lr 1e-4 (2.5 "
        "for the mean over the batch's 25,088 elements): gradient norms in the thousands, matched by the lr.",
        truth=c.truth(
            evidence=f"{c.HEALTHY.evidence}; the same run with the mean loss and lr 2.5 has gradient norms below "
            "0.1 and follows the same weights (2.5e-7 of the distance travelled)"
        ),
        build=_sum_sgd_scaled,
    ),
    Scenario(
        name="exploding_summed_loss_sgd_lr_too_high",
        arch="mlp",
        description="An MLP regressor with a squared error summed over its batch of 64, trained with SGD at lr 0.02, "
        "a learning rate meant for a mean: each step overshoots further and the run ends in NaN.",
        truth=c.truth(
            ["exploding_gradients"],
            may_also=["non_finite", "dead_neurons", "vanishing_gradients"],
            onset=(0, 3),
            evidence="total gradient norm 400 at step 0 with a loss gradient of 35, 5.7e4 (1.6e3 x 35) at step 1, "
            "NaN by step 5; updates as large as the weights from step 0; the ReLUs die and the gradient through "
            "them vanishes on the way; at lr 0.02 / 64 the same run is healthy",
        ),
        build=_sum_sgd_too_high,
    ),
]
