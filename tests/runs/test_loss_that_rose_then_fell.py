"""A loss that rises and then falls steeply to the end of the run is decreasing, not "not decreasing": a VQ-VAE's
codebook and commitment terms grow while the encoder's outputs drift and the codebook chases them, then shrink as the
two settle (hunt 21: seed 0 of a healthy VQ-VAE was told "the model is not learning", its last quarter's mean above
its first steps'). Ground truth is plain torch: the held-out reconstruction error against the data's variance, and
the loss's own curve."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

STEPS = 300


class VQ(nn.Module):
    """An encoder to 8 dimensions, a codebook of 32 codes (straight-through), a decoder."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 8))
        self.codebook = nn.Embedding(32, 8)
        self.dec = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z = self.enc(x)
        code = self.codebook(torch.cdist(z, self.codebook.weight).argmin(1))
        out = self.dec(z + (code - z).detach())
        return out, F.mse_loss(code, z.detach()), F.mse_loss(z, code.detach())


def train(watched: bool) -> tuple[list[float], float, NeuralDbg | None]:
    g = torch.Generator().manual_seed(1000)
    centres = torch.randn(8, 16, generator=g) * 2

    def data(n: int) -> torch.Tensor:
        return centres[torch.randint(0, 8, (n,), generator=g)] + 0.3 * torch.randn(n, 16, generator=g)

    train_x, held_x = data(2048), data(512)
    torch.manual_seed(0)
    model = VQ()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []

    def loop() -> None:
        for _ in range(STEPS):
            x = train_x[torch.randint(0, 2048, (64,), generator=g)]
            out, codebook, commitment = model(x)
            loss = F.mse_loss(out, x) + codebook + 0.25 * commitment
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())

    dbg = support.watching(model, loop, watched)
    with torch.no_grad():
        error = F.mse_loss(model(held_x)[0], held_x).item()
    return losses, error, dbg


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_a_vq_vae_whose_loss_rose_and_then_fell_to_the_end_is_healthy():
    losses, error, _ = train(watched=False)
    # plain torch: the reconstruction is learned (the data's variance is about 4) ...
    assert error < 0.2
    # ... while the whole loss rose and then fell: its last quarter above its first steps, its last sixth far below
    # the middle of the run
    assert mean(losses[-STEPS // 4 :]) > mean(losses[: STEPS // 8])
    assert mean(losses[-STEPS // 6 :]) < 0.5 * mean(losses[STEPS // 2 : STEPS // 2 + STEPS // 6])
    watched, _, dbg = train(watched=True)
    assert watched == losses
    assert dbg is not None and dbg.healthy, dbg.explain_failure()
