"""A VAE whose KL term was written without its leading minus maximises the KL divergence: the loss falls without
bound (to about -1e9) while the gradients explode. The explanation names the loss's sign, not only the learning
rate, which would just slow it down. Ground truth by plain torch: the losses, the KL of the held-out codes, and the
same VAE with the KL's sign right (silent)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.kinds.exploding_gradients import unbounded_fall

STEPS = 450


def data(n: int, g: torch.Generator) -> torch.Tensor:
    """24-dimensional points on a curved 2-dimensional surface, with noise."""
    mix = torch.Generator().manual_seed(21)
    a, b = torch.randn(2, 16, generator=mix), torch.randn(16, 24, generator=mix) / 4
    return torch.tanh(torch.randn(n, 2, generator=g) @ a) @ b * 2 + 0.1 * torch.randn(n, 24, generator=g)


class Vae(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.mu, self.logvar = nn.Linear(64, 8), nn.Linear(64, 8)
        self.decoder = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 24))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.encoder(x)
        mu, logvar = self.mu(h), self.logvar(h)
        return self.decoder(mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)), mu, logvar


def kl_divergence(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    return -0.5 * (1 + logvar - mu**2 - logvar.exp()).sum(1).mean()


def train(sign: float) -> tuple[NeuralDbg, list[float], float]:
    """(debugger, losses, KL of the held-out codes); ``sign`` -1: the KL term subtracted (its minus forgotten)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    points, held_out = data(4000, g), data(1000, torch.Generator().manual_seed(2))
    model = Vae()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    with NeuralDbg(model) as dbg:
        for step in range(STEPS):
            x = points[torch.randint(0, len(points), (64,), generator=g)]
            recon, mu, logvar = model(x)
            beta = min(1.0, step / (STEPS / 3))  # the KL annealed in over the first third
            loss = ((recon - x) ** 2).sum(1).mean() * 50 + sign * beta * kl_divergence(mu, logvar)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    with torch.no_grad():
        _, mu, logvar = model(held_out)
    return dbg, losses, float(kl_divergence(mu, logvar))


@pytest.mark.parametrize("sign", [-1.0, 1.0])
def test_a_kl_term_with_its_sign_flipped_is_named_by_the_loss_falling_without_bound(sign):
    dbg, losses, kl = train(sign)
    if sign > 0:
        assert losses[-1] > 0 and kl < 100  # plain torch: the right sign keeps the codes near the prior
        assert dbg.healthy, dbg.explain_failure()
        return
    # plain torch: the loss runs to minus a million times its start and the codes' KL with it
    assert min(losses) < -1e6 * abs(losses[0]) and kl > 1e6
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.EXPLODING_GRADIENTS, dbg.report()
    text = dbg.explain_failure()[0]
    assert "fell without bound" in text and "check the sign of each term of the loss" in text, text


def test_a_loss_that_is_negative_but_bounded_is_not_called_unbounded():
    def series(losses: list[float]):
        return lambda metric, layer: list(enumerate(losses)) if (metric, layer) == ("loss", "") else []

    assert unbounded_fall(series([3.0, -1.0, -1.3])) is None  # a flow's negative log-likelihood
    assert unbounded_fall(series([2.0, -1500.0])) is None  # a thousand times the start, not past it
    assert unbounded_fall(series([2.0, -2500.0])) == (2.0, -2500.0)
    assert unbounded_fall(series([0.01, -900.0])) is None  # against 1 when the start is small
    assert unbounded_fall(None) is None
