"""No nonlinearity, and layers side by side: DLinear (Zeng et al. 2023) splits its input series into a trend (a
moving average) and a seasonal rest, maps each with its own Linear (seq_len -> pred_len) and sums the two outputs. It
is a linear model by design, and its layers do not compose: no layer reads another's output, so the depth is one, as
a single Linear's is. Ground truth in plain torch: the fit reaches the least-squares linear optimum (no linear model
does better), and the model is linear in its input. The faulty twin, two Linears stacked (the second reads the
first's output) without an activation, composes into one affine map and is still found."""

from __future__ import annotations

from functools import partial

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg.capture.affine import affine_layers

KIND = "no_nonlinearity"
STEPS = 200
L, H, C, NOISE = 24, 6, 2, 0.1  # input length, horizon, channels, noise of the series


def series(step: int, batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy sines of period 12 with a random phase and a random trend, per channel: the past L steps, the next H."""
    g = torch.Generator().manual_seed(step)
    t = torch.arange(L + H).float()[None, :, None]
    phase = 6.28 * torch.rand(batch, 1, C, generator=g)
    slope = 0.02 * torch.randn(batch, 1, C, generator=g)
    s = torch.sin(6.28 * t / 12 + phase) + slope * t + NOISE * torch.randn(batch, L + H, C, generator=g)
    return s[:, :L], s[:, L:]


def trend_of(x: torch.Tensor, k: int = 7) -> torch.Tensor:
    """A moving average along time, the ends repeated (DLinear's series decomposition)."""
    padded = torch.cat([x[:, :1].repeat(1, k // 2, 1), x, x[:, -1:].repeat(1, k // 2, 1)], 1)
    return F.avg_pool1d(padded.permute(0, 2, 1), k, 1).permute(0, 2, 1)


class DLinear(nn.Module):
    """The trend and the seasonal rest each mapped by its own Linear over time, summed; ``branches=3`` adds a third
    Linear on the raw input (three heads side by side)."""

    def __init__(self, branches: int = 2) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(L, H) for _ in range(branches))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        trend = trend_of(x)
        parts = [trend, x - trend, x][: len(self.heads)]
        return sum(head(p.permute(0, 2, 1)) for head, p in zip(self.heads, parts)).permute(0, 2, 1)


class Stacked(nn.Module):
    """The faulty twin: a Linear over time, then another reading its output, nothing between them."""

    def __init__(self) -> None:
        super().__init__()
        self.lower, self.upper = nn.Linear(L, 32), nn.Linear(32, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.upper(self.lower(x.permute(0, 2, 1))).permute(0, 2, 1)


def run(build, watched: bool):
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    losses, dbg = support.fit(model, series, F.mse_loss, STEPS, opt, watched)
    return model, losses, dbg


def flat(x: torch.Tensor) -> torch.Tensor:
    """Each channel's window as one row, with a column of ones (channel-independent, as DLinear is)."""
    rows = x.permute(0, 2, 1).reshape(-1, x.size(1))
    return torch.cat([rows, torch.ones(len(rows), 1)], 1)


def held_out(model: nn.Module) -> tuple[float, float]:
    """The model's held-out mean squared error, and that of the least-squares linear optimum fitted on fresh data."""
    xt, yt = series(10_000, batch=4096)
    best = torch.linalg.lstsq(flat(xt), yt.permute(0, 2, 1).reshape(-1, H)).solution
    x, y = series(20_000, batch=2048)
    with torch.no_grad():
        mse = float(F.mse_loss(model(x), y))
    optimum = float(F.mse_loss(flat(x) @ best, y.permute(0, 2, 1).reshape(-1, H)))
    return mse, optimum


def kinds(dbg) -> list[str]:
    return [h.kind.value for h in dbg.hypotheses()]


def test_the_graph_walk_counts_layers_in_series_not_side_by_side():
    x = torch.randn(4, L, C)
    assert affine_layers(DLinear()(x).grad_fn) == 1
    assert affine_layers(DLinear(branches=3)(x).grad_fn) == 1
    assert affine_layers(Stacked()(x).grad_fn) == 2
    # two heads side by side, then a layer reading their sum: two in series
    a, b, c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)
    y = torch.randn(5, 8)
    assert affine_layers((a(y) + b(y)).grad_fn) == 1
    assert affine_layers(c(a(y) + b(y)).grad_fn) == 2


def test_dlinear_heads_side_by_side_are_one_linear_model_and_the_stacked_twin_is_found():
    for branches in (2, 3):
        model, losses, _ = run(partial(DLinear, branches), watched=False)
        mse, optimum = held_out(model)
        # plain torch: within a quarter of the best any linear model does (the noise floor is 0.01, the targets'
        # variance 0.8): no depth to waste, nothing a deeper linear stack could gain
        assert mse < 1.25 * optimum, (branches, mse, optimum)
        _, watched, dbg = run(partial(DLinear, branches), watched=True)
        assert watched == losses  # the debugger changes nothing
        assert KIND not in kinds(dbg), dbg.explain_failure()

    twin, losses, _ = run(Stacked, watched=False)
    x = torch.randn(3, L, C)
    with torch.no_grad():  # plain torch: the two layers compose into one affine map of the input
        w = twin.upper.weight @ twin.lower.weight
        b = twin.upper.weight @ twin.lower.bias + twin.upper.bias
        assert torch.allclose(twin(x), (x.permute(0, 2, 1) @ w.T + b).permute(0, 2, 1), atol=1e-5)
    _, watched, dbg = run(Stacked, watched=True)
    assert watched == losses
    assert KIND in kinds(dbg), dbg.explain_failure()
    found = next(h for h in dbg.hypotheses() if h.kind.value == KIND)
    assert found.root.metrics["layers"] == 2 and "its 2 layers in series" in found.explanation
