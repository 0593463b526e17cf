"""A parameter initialised to zeros that a layer of its own holds (here the decoder bias of a tied autoencoder,
held by the model itself) grows from nothing: under Adam each step moves it by about the learning rate per
element, so by 1/t of its size at step t, whatever the learning rate. Taken as a layer among two, it made the
median update ratio 0.5, 0.27, 0.19, ... over the first steps, which, with the loss wobbling up at step 1, read as
oversized updates. Those layers are left out of the median while another layer is there; a learning rate far too
high still moves the other layers by large shares."""

from __future__ import annotations

import contextlib
import statistics

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 200


class TiedAE(nn.Module):
    """Encoder Linear(40, 12), sigmoid code, decoder = the encoder's transpose plus a zero-initialised bias."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(40, 12)
        self.decoder_bias = nn.Parameter(torch.zeros(40))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(torch.sigmoid(self.encoder(x)), self.encoder.weight.t(), self.decoder_bias)


def run(lr: float, watch: bool) -> tuple[NeuralDbg | None, list[float], list[float], list[float]]:
    """Returns the debugger (when watched), the losses, and per step ||dW||/||W|| of the encoder (weight and bias)
    and of the decoder bias (plain torch)."""
    torch.manual_seed(3000)
    basis = torch.randn(6, 40)
    model = TiedAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses: list[float] = []
    encoder: list[float] = []
    bias: list[float] = []
    dbg = NeuralDbg(model) if watch else None

    def encoder_flat() -> torch.Tensor:
        return torch.cat([model.encoder.weight.detach().flatten(), model.encoder.bias.detach().flatten()])

    with dbg if dbg is not None else contextlib.nullcontext():
        for _ in range(STEPS):
            clean = torch.rand(32, 6) @ basis
            noisy = clean * (torch.rand_like(clean) > 0.2)
            loss = F.mse_loss(model(noisy), clean)
            optimizer.zero_grad()
            loss.backward()
            enc, dec = encoder_flat().clone(), model.decoder_bias.detach().clone()
            optimizer.step()
            encoder.append(float((encoder_flat() - enc).norm() / enc.norm()))
            bias.append(float((model.decoder_bias.detach() - dec).norm() / dec.norm()) if dec.norm() > 0 else 1.0)
            losses.append(loss.item())
    return dbg, losses, encoder, bias


def test_a_zero_initialised_parameter_growing_under_adam_is_no_oversized_update() -> None:
    _, losses, encoder, bias = run(5e-3, watch=False)

    # plain torch: the zero bias moves by 1/t of its size at step t >= 1 (Adam's constant-size steps from nothing),
    # the encoder by at most 6 % from the first step on; the loss wobbles up at step 1, then falls well
    assert all(abs(bias[t] * t - 1) < 0.05 for t in range(1, 6))
    assert max(encoder) < 0.06
    assert losses[1] > 1.1 * losses[0]
    assert statistics.fmean(losses[-20:]) < 0.4 * statistics.fmean(losses[:20])

    dbg, watched, _, _ = run(5e-3, watch=True)
    assert dbg is not None
    assert watched == losses
    assert FailureKind.OVERSIZED_UPDATES not in {h.kind for h in dbg.hypotheses()}, dbg.report()
    assert dbg.hypotheses() == []


class OffsetRegression(nn.Module):
    """A Linear(16, 1) plus an output offset initialised to zeros, held by the model itself."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 1)
        self.offset = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.offset


def regression(lr: float, watch: bool) -> tuple[NeuralDbg | None, list[float], list[float]]:
    """Returns the debugger (when watched), the losses and ||dW||/||W|| of the Linear per step (plain torch)."""
    torch.manual_seed(0)
    teacher = torch.randn(16, 1)
    model = OffsetRegression()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses: list[float] = []
    ratios: list[float] = []
    dbg = NeuralDbg(model) if watch else None
    with dbg if dbg is not None else contextlib.nullcontext():
        for _ in range(STEPS):
            x = torch.randn(32, 16)
            loss = F.mse_loss(model(x), x @ teacher + 0.5)
            optimizer.zero_grad()
            loss.backward()
            before = torch.cat([p.detach().flatten() for p in model.linear.parameters()])
            optimizer.step()
            after = torch.cat([p.detach().flatten() for p in model.linear.parameters()])
            ratios.append(float((after - before).norm() / before.norm()))
            losses.append(loss.item())
    return dbg, losses, ratios


def test_a_learning_rate_far_too_high_beside_a_zero_initialised_parameter_still_has_oversized_updates() -> None:
    _, losses, ratios = regression(10.0, watch=False)
    _, healthy, healthy_ratios = regression(1e-2, watch=False)

    # plain torch: the Linear itself (not grown from zero) moves by large shares of its weights, and the fit ends
    # far worse than at a sane learning rate
    assert statistics.median(ratios[:20]) > 0.3
    assert max(healthy_ratios) < 0.1
    assert statistics.fmean(losses[-20:]) > 20 * statistics.fmean(healthy[-20:])

    dbg, _, _ = regression(10.0, watch=True)
    assert dbg is not None
    assert dbg.hypotheses()[0].kind is FailureKind.OVERSIZED_UPDATES, dbg.report()
    healthy_dbg, _, _ = regression(1e-2, watch=True)
    assert healthy_dbg is not None and healthy_dbg.hypotheses() == [], healthy_dbg.report()
