"""An LSTM forecaster fed a demand series as it is (values about 3000) saturates its gates from the first steps:
its gradients vanish and the loss does not fall. The explanation names the input's scale and asks to standardise
it first. Ground truth by plain torch: the LSTM's gradient against the head's, and the held-out error of the twin
fed the standardised series (silent)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

WINDOW = 28


def demand(n: int = 3000) -> torch.Tensor:
    """A daily series: level 3000, a trend, weekly and yearly seasons, noise."""
    t = torch.arange(n).float()
    noise = 120 * torch.randn(n, generator=torch.Generator().manual_seed(4))
    return 3000 + 0.3 * t + 400 * torch.sin(2 * math.pi * t / 7) + 600 * torch.sin(2 * math.pi * t / 365) + noise


class Forecaster(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(1, 32, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(x)
        return self.head(hidden[:, -1])


def train(standardised: bool) -> tuple[NeuralDbg, list[float], float, float]:
    """(debugger, losses, the LSTM's gradient norm over the head's at the last step, held-out mean absolute error
    over the series' standard deviation)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    y = demand()
    split = int(len(y) * 0.8)
    mean, sd = y[:split].mean(), y[:split].std()
    series = (y - mean) / sd if standardised else y
    starts = torch.arange(0, split - WINDOW)
    x = series[starts[:, None] + torch.arange(WINDOW)].unsqueeze(-1)
    target = series[starts + WINDOW].unsqueeze(-1)
    model = Forecaster()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    with NeuralDbg(model) as dbg:
        for _ in range(300):
            i = torch.randint(0, len(x), (64,), generator=g)
            loss = nn.functional.mse_loss(model(x[i]), target[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    lstm = torch.cat([p.grad.flatten() for p in model.lstm.parameters()]).norm()
    head = torch.cat([p.grad.flatten() for p in model.head.parameters()]).norm()
    held = torch.arange(split, len(y) - WINDOW)
    with torch.no_grad():
        predicted = model(series[held[:, None] + torch.arange(WINDOW)].unsqueeze(-1))[:, 0]
    if standardised:
        predicted = predicted * sd + mean
    return dbg, losses, float(lstm / head), float((predicted - y[held + WINDOW]).abs().mean() / sd)


@pytest.mark.parametrize("standardised", [False, True])
def test_a_raw_series_fed_to_an_lstm_is_named_by_its_scale(standardised):
    dbg, losses, ratio, error = train(standardised)
    if standardised:
        assert error < 0.5 and ratio > 1e-3  # plain torch: the twin fits, its LSTM learns
        assert dbg.healthy, dbg.explain_failure()
        return
    # plain torch: the LSTM's gradient is a vanishing share of the head's, the loss stays where it began
    assert ratio < 1e-6 and error > 1.0 and sum(losses[-30:]) / 30 > 0.5 * sum(losses[:30]) / 30
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.VANISHING_GRADIENTS and top.root.layer == "lstm", dbg.report()
    text = dbg.explain_failure()[0]
    assert "enters 'lstm' (LSTM), the first layer it meets" in text and "standardise the inputs" in text, text
