"""Weights whose rows start equal without being identical units, so 'identical units' must stay silent: a
normalisation layer's elementwise gain (``nn.LayerNorm([C, H, W])``: each element scales a feature of its own),
heads whose outputs are the model's outputs (DLinear's two heads, both set to 1/L and summed: each row answers to a
forecast step of its own), and depthwise kernels that all start as one blur (each reads a channel of its own).
Ground truth is plain torch in each test: the model learns, and the rows' gradients differ (identical units get
identical gradients). Each has a twin with layers started constant whose units are alike, still found."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

KIND = "symmetric_units"


def spread(rows: torch.Tensor) -> float:
    """``||R - mean row|| / ||R||``: 0 for identical rows, about 1 for independent ones."""
    rows = rows.detach().reshape(rows.shape[0], -1).double()
    return float((rows - rows.mean(0)).norm() / rows.norm())


def found(dbg: NeuralDbg | None) -> list[str]:
    """The layers 'identical units' names."""
    assert dbg is not None
    return [n for h in dbg.hypotheses() if h.kind.value == KIND for n in h.root.detail.split(", ")]


def fit(model: nn.Module, batches, loss_fn, steps: int, watched: bool, grads: nn.Parameter | None = None):
    """SGD with momentum, plain or under NeuralDbg; with ``grads``, the spread of that parameter's gradient rows on
    each of the first steps."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.__enter__()
    losses, spreads = [], []
    for step in range(steps):
        x, y = batches(step)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        if grads is not None and step < 5:
            spreads.append(spread(grads.grad))
        opt.step()
        losses.append(loss.item())
    if dbg is not None:
        dbg.__exit__(None, None, None)
    return losses, spreads, dbg


# --- a normalisation layer's elementwise gain ----------------------------------------------------------------------


def quadrants(step: int, batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """8x8 noisy images whose class is the quadrant that is bright."""
    g = torch.Generator().manual_seed(step)
    y = torch.randint(0, 4, (batch,), generator=g)
    x = 0.5 * torch.randn(batch, 1, 8, 8, generator=g)
    for k in range(4):
        r, c = divmod(k, 2)
        x[y == k, :, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4] += 1.0
    return x, y


def accuracy(model: nn.Module) -> float:
    x, y = quadrants(10_000, batch=1024)
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def critic(constant: bool) -> nn.Sequential:
    """A conv classifier with ``nn.LayerNorm([C, H, W])`` (its gain starts at ones, PyTorch's default); in the twin
    every convolution's and Linear layer's weight is set to 0.05 (the gain keeps its start)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.LeakyReLU(0.2),
        nn.Conv2d(8, 8, 4, 2, 1),
        nn.LayerNorm([8, 4, 4]),
        nn.LeakyReLU(0.2),
        nn.Flatten(),
        nn.Linear(128, 32),
        nn.ReLU(),
        nn.Linear(32, 4),
    )
    for layer in model:
        if constant and isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.constant_(layer.weight, 0.05)
    return model


def test_a_layer_norm_gain_over_channels_and_positions_is_no_units():
    model = critic(False)
    _, grads, _ = fit(model, quadrants, F.cross_entropy, 60, False, model[3].weight)
    # plain torch: it learns, and its gain's 'rows' (channels) take different gradients: no identical units
    assert accuracy(model) > 0.95 and min(grads) > 0.5
    _, _, dbg = fit(critic(False), quadrants, F.cross_entropy, 60, True)
    assert not found(dbg), dbg and dbg.explain_failure()


def test_constant_layers_around_a_layer_norm_are_still_found():
    model = critic(True)
    fit(model, quadrants, F.cross_entropy, 60, False)
    # plain torch: it learns far less than the default start (above 0.95 above), its layers' units near-copies
    assert accuracy(model) < 0.8
    assert max(spread(model[i].weight) for i in (0, 2, 6)) < 0.5
    _, _, dbg = fit(critic(True), quadrants, F.cross_entropy, 60, True)
    assert set(found(dbg)) == {"0", "2", "6"}, dbg and dbg.explain_failure()  # not the gain '3', not the head '8'


# --- heads whose outputs are the model's outputs -------------------------------------------------------------------

PAST, AHEAD, SERIES = 24, 6, 2


def series(step: int, batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy seasonal series with a random trend: PAST steps in, the AHEAD steps after them to forecast."""
    g = torch.Generator().manual_seed(step)
    t = torch.arange(PAST + AHEAD).float()[None, :, None]
    phase = torch.rand(batch, 1, SERIES, generator=g) * 6.28
    s = torch.sin(6.28 * t / 12 + phase) + 0.02 * t * torch.randn(batch, 1, SERIES, generator=g)
    s = s + 0.1 * torch.randn(batch, PAST + AHEAD, SERIES, generator=g)
    return s[:, :PAST], s[:, PAST:]


class DLinear(nn.Module):
    """DLinear (Zeng et al. 2023): a moving average splits each series into trend and rest, one Linear head forecasts
    each, the two forecasts are summed. The official initialisation sets both heads' weights to 1/PAST."""

    def __init__(self) -> None:
        super().__init__()
        self.average = nn.AvgPool1d(7, 1, padding=3, count_include_pad=False)
        self.seasonal, self.trend = nn.Linear(PAST, AHEAD), nn.Linear(PAST, AHEAD)
        for head in (self.seasonal, self.trend):
            nn.init.constant_(head.weight, 1 / PAST)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 1)
        trend = self.average(x)
        return (self.seasonal(x - trend) + self.trend(trend)).permute(0, 2, 1)


class Forecaster(nn.Module):
    """The twin: a hidden layer between the past and the forecast, its weights and the head's set to 0.05."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(PAST, 32), nn.ReLU(), nn.Linear(32, AHEAD))
        for layer in (self.net[0], self.net[2]):
            nn.init.constant_(layer.weight, 0.05)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.permute(0, 2, 1)).permute(0, 2, 1)


def held_out(model: nn.Module) -> float:
    x, y = series(10_000, batch=1024)
    with torch.no_grad():
        return float(F.mse_loss(model(x), y))


def test_heads_whose_outputs_are_the_models_outputs_are_told_apart_by_the_loss():
    torch.manual_seed(0)
    model = DLinear()
    _, grads, _ = fit(model, series, F.mse_loss, 150, False, model.seasonal.weight)
    # plain torch: each row of a head gets the error of its own forecast step, so their gradients differ from the
    # first step, and the forecast reaches the noise (0.01) within a little, far below the series' variance
    assert min(grads) > 0.5
    assert held_out(model) < 0.02 < 0.1 < float(series(10_000, batch=1024)[1].var())
    torch.manual_seed(0)
    _, _, dbg = fit(DLinear(), series, F.mse_loss, 150, True)
    assert not found(dbg), dbg and dbg.explain_failure()


def test_a_constant_hidden_layer_before_a_forecast_head_is_still_found():
    torch.manual_seed(0)
    faulty = Forecaster()
    fit(faulty, series, F.mse_loss, 150, False)
    torch.manual_seed(0)
    healthy = Forecaster()
    nn.init.kaiming_uniform_(healthy.net[0].weight, a=5**0.5)  # PyTorch's default start for the hidden layer
    fit(healthy, series, F.mse_loss, 150, False)
    # plain torch: the hidden units are still near-copies, and it forecasts clearly worse than with a random start
    assert spread(faulty.net[0].weight) < 0.8 and held_out(faulty) > 1.5 * held_out(healthy)
    torch.manual_seed(0)
    _, _, dbg = fit(Forecaster(), series, F.mse_loss, 150, True)
    assert found(dbg) == ["net.0"], dbg and dbg.explain_failure()  # the head, set to 0.05 too, answers to the loss


# --- a grouped convolution: equal kernels in different groups read different channels ------------------------------


def blurred(identical_within: bool) -> nn.Sequential:
    """A conv net with learnable depthwise blurs (groups = channels), each channel's 3x3 kernel started as the same
    binomial filter; in the twin, a grouped convolution (two groups of four channels: those of one group read the same
    inputs) and the head set to 0.05."""
    torch.manual_seed(0)

    def blur(c: int) -> nn.Conv2d:
        conv = nn.Conv2d(c, c, 3, 2, 1, groups=c, bias=False)
        k = torch.tensor([1.0, 2.0, 1.0])
        with torch.no_grad():
            conv.weight.copy_((k[:, None] * k[None] / 16).expand(c, 1, 3, 3))
        return conv

    mixing, head = nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.Linear(8, 4)
    if identical_within:
        nn.init.constant_(mixing.weight, 0.05)
        nn.init.constant_(head.weight, 0.05)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        blur(8),
        mixing,
        nn.BatchNorm2d(8),
        nn.ReLU(),
        blur(8),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        head,
    )


def test_depthwise_kernels_started_alike_are_no_identical_units():
    model = blurred(False)
    _, grads, _ = fit(model, quadrants, F.cross_entropy, 60, False, model[3].weight)
    # plain torch: each channel's kernel reads its own input channel, and takes a gradient of its own
    assert accuracy(model) > 0.95 and min(grads) > 0.5
    _, _, dbg = fit(blurred(False), quadrants, F.cross_entropy, 60, True)
    assert not found(dbg), dbg and dbg.explain_failure()


def test_a_grouped_convolution_whose_units_start_alike_within_a_group_is_found():
    model = blurred(True)
    fit(model, quadrants, F.cross_entropy, 60, False)
    # plain torch: batch norm keeps the channels of each group exact copies (they read the same inputs), and the
    # groups apart (they read different ones)
    groups = model[4].weight.detach().reshape(2, 4, -1)
    assert float((groups - groups[:, :1]).abs().max()) < 1e-6 < float((groups[0] - groups[1]).abs().max())
    _, _, dbg = fit(blurred(True), quadrants, F.cross_entropy, 60, True)
    assert found(dbg) == ["4"], dbg and dbg.explain_failure()
