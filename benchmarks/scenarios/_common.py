"""Building blocks shared by the scenario modules: seeded data, small models, custom training loops.

Every batch function is pure in the step index: ``batch(k)`` draws from a generator seeded with ``(seed, k)``,
so it returns the same tensors however often and in whatever order it is called.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable

import torch
from torch import nn

from .base import Batch, GroundTruth, Run, StepProbe

BatchFn = Callable[[int], Batch]
Loop = Callable[[Run, StepProbe | None], None]


# --------------------------------------------------------------------------------------------- ground truth


def truth(
    kinds: Iterable[str] = (),
    *,
    may_also: Iterable[str] = (),
    roots: Iterable[str] | None = None,
    onset: tuple[int, int] | None = None,
    evidence: str = "",
) -> GroundTruth:
    """A :class:`GroundTruth` from plain iterables."""
    return GroundTruth(
        kinds=frozenset(kinds),
        may_also=frozenset(may_also),
        root_layers=None if roots is None else frozenset(roots),
        onset=onset,
        evidence=evidence,
    )


HEALTHY = truth(
    evidence="finite throughout, loss falls, no ReLU layer >=50% dead, no hidden tanh/sigmoid saturated, "
    "every trainable module updated with a healthy update/weight ratio"
)


# ----------------------------------------------------------------------------------------------------- data


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _step_generator(seed: int, step: int) -> torch.Generator:
    return generator(seed * 1_000_003 + step)


def regression(in_dim: int, out_dim: int, batch_size: int, seed: int, *, bias: float = 0.0) -> BatchFn:
    """Inputs ~ N(0, 1); targets from a fixed smooth teacher ``tanh(x @ W) @ V + bias``."""
    g = generator(seed)
    w = torch.randn(in_dim, 16, generator=g) / math.sqrt(in_dim)
    v = torch.randn(16, out_dim, generator=g) / 2.0

    def batch(step: int) -> Batch:
        x = torch.randn(batch_size, in_dim, generator=_step_generator(seed, step))
        return x, torch.tanh(2.0 * x @ w) @ v + bias

    return batch


def linear_regression(in_dim: int, out_dim: int, batch_size: int, seed: int) -> BatchFn:
    """Noise-free linear targets: a model with a linear path can fit them exactly."""
    w = torch.randn(in_dim, out_dim, generator=generator(seed)) / math.sqrt(in_dim)

    def batch(step: int) -> Batch:
        x = torch.randn(batch_size, in_dim, generator=_step_generator(seed, step))
        return x, x @ w

    return batch


def classification(in_dim: int, classes: int, batch_size: int, seed: int) -> BatchFn:
    """Inputs ~ N(0, 1); the label is the arg-max of a fixed linear teacher."""
    w = torch.randn(in_dim, classes, generator=generator(seed))

    def batch(step: int) -> Batch:
        x = torch.randn(batch_size, in_dim, generator=_step_generator(seed, step))
        return x, (x @ w).argmax(dim=1)

    return batch


def binary(in_dim: int, batch_size: int, seed: int, *, margin: float = 0.0) -> BatchFn:
    """Linearly separable 0/1 labels (float targets for ``BCELoss``), ``margin`` away from the boundary."""
    w = torch.randn(in_dim, generator=generator(seed))
    w = w / w.norm()

    def batch(step: int) -> Batch:
        x = torch.randn(batch_size, in_dim, generator=_step_generator(seed, step))
        side = (x @ w > 0).float()
        x = x + margin * (2.0 * side - 1.0)[:, None] * w
        return x, side[:, None]

    return batch


def images(channels: int, size: int, classes: int, batch_size: int, seed: int) -> BatchFn:
    """Noisy images whose class sets a per-class colour shift and a per-class texture."""
    g = generator(seed)
    shift = torch.randn(classes, channels, 1, 1, generator=g)
    texture = torch.randn(classes, channels, size, size, generator=g) * 0.5

    def batch(step: int) -> Batch:
        gs = _step_generator(seed, step)
        y = torch.randint(0, classes, (batch_size,), generator=gs)
        x = torch.randn(batch_size, channels, size, size, generator=gs) + shift[y] + texture[y]
        return x, y

    return batch


def sequences(features: int, length: int, classes: int, batch_size: int, seed: int) -> BatchFn:
    """Sequences (batch, time, features); the label is the arg-max of a linear teacher on the time average."""
    w = torch.randn(features, classes, generator=generator(seed))

    def batch(step: int) -> Batch:
        x = torch.randn(batch_size, length, features, generator=_step_generator(seed, step))
        return x, (x.mean(dim=1) @ w).argmax(dim=1)

    return batch


def sequence_regression(features: int, length: int, batch_size: int, seed: int) -> BatchFn:
    """Sequences (batch, time, features); the target is a decaying sum of their projection on a direction."""
    w = torch.randn(features, generator=generator(seed)) / math.sqrt(features)
    decay = 0.7 ** torch.arange(length - 1, -1, -1, dtype=torch.float32)

    def batch(step: int) -> Batch:
        x = torch.randn(batch_size, length, features, generator=_step_generator(seed, step))
        return x, ((x @ w) * decay).sum(dim=1, keepdim=True)

    return batch


def poisoned(batch: BatchFn, at_step: int, value: float, *, rows: int = 1) -> BatchFn:
    """``batch`` with ``value`` (NaN or inf) in the first input feature of ``rows`` samples at one step."""

    def poisoned_batch(step: int) -> Batch:
        x, y = batch(step)
        if step == at_step:
            x = x.clone()
            x.view(x.shape[0], -1)[:rows, 0] = value
        return x, y

    return poisoned_batch


def scaled_targets(batch: BatchFn, at_step: int, factor: float) -> BatchFn:
    """``batch`` whose targets are multiplied by ``factor`` at one step (a unit mistake in one shard)."""

    def bad_batch(step: int) -> Batch:
        x, y = batch(step)
        return (x, y * factor) if step == at_step else (x, y)

    return bad_batch


# --------------------------------------------------------------------------------------------------- models


def tiny_model() -> nn.Sequential:
    """The README model."""
    return nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 1))


def mlp(sizes: list[int], act: Callable[[], nn.Module] = nn.ReLU, *, last_act: bool = False) -> nn.Sequential:
    """``Linear -> act -> ... -> Linear`` as an ``nn.Sequential`` (names "0", "1", ...)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or last_act:
            layers.append(act())
    return nn.Sequential(*layers)


class ResidualBlock(nn.Module):
    """Pre-norm residual MLP block: ``x + fc2(relu(fc1(norm(x))))``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class ResidualMLP(nn.Module):
    """Input projection, ``depth`` pre-norm residual blocks, a final LayerNorm and a linear head."""

    def __init__(self, in_dim: int, dim: int, depth: int, out_dim: int, hidden: int | None = None) -> None:
        super().__init__()
        self.inp = nn.Linear(in_dim, dim)
        self.blocks = nn.ModuleList(ResidualBlock(dim, hidden or 2 * dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


class SmallCNN(nn.Module):
    """Two conv/BatchNorm/ReLU stages, global average pooling and a linear classifier."""

    def __init__(
        self,
        channels: int = 3,
        classes: int = 4,
        width: int = 16,
        *,
        conv_bias: bool = False,
        inplace: bool = False,
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, padding=1, bias=conv_bias)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU(inplace=inplace)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1, bias=conv_bias)
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.relu2 = nn.ReLU(inplace=inplace)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.relu2(self.bn2(self.conv2(x)))
        return self.fc(self.pool(x).flatten(1))


class RecurrentClassifier(nn.Module):
    """An LSTM or GRU over (batch, time, features); the head reads the last time step."""

    def __init__(self, features: int, hidden: int, out_dim: int, *, cell: str = "lstm", layers: int = 1) -> None:
        super().__init__()
        rnn_type = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn_type(features, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class TinyTransformer(nn.Module):
    """Linear embedding, a small ``nn.TransformerEncoder`` (batch_first), mean pooling, linear head."""

    def __init__(
        self,
        features: int,
        d_model: int,
        out_dim: int,
        *,
        layers: int = 2,
        heads: int = 2,
        dropout: float = 0.0,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.embed = nn.Linear(features, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model,
            heads,
            dim_feedforward=2 * d_model,
            dropout=dropout,
            batch_first=True,
            norm_first=norm_first,
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(dim=1))


# ---------------------------------------------------------------------------------------------------- loops


def lr_change_loop(at_step: int, lr: float, *, group: int | None = None) -> Loop:
    """A plain loop that sets the learning rate (of every group, or of one) to ``lr`` at step ``at_step``."""

    def loop(run: Run, probe: StepProbe | None) -> None:
        opt = run.optimizers[0]
        for step in range(run.steps):
            if step == at_step:
                groups = opt.param_groups if group is None else [opt.param_groups[group]]
                for g in groups:
                    g["lr"] = lr
            inputs, targets = run.batch(step)
            opt.zero_grad()
            loss = run.loss_fn(run.model(inputs), targets)
            loss.backward()
            if probe is not None:
                probe(step, run.model, loss.detach())
            opt.step()

    return loop


def scheduler_loop(
    make_scheduler: Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler],
) -> Loop:
    """A plain loop that steps a learning-rate scheduler after every optimizer step."""

    def loop(run: Run, probe: StepProbe | None) -> None:
        opt = run.optimizers[0]
        scheduler = make_scheduler(opt)
        for step in range(run.steps):
            inputs, targets = run.batch(step)
            opt.zero_grad()
            loss = run.loss_fn(run.model(inputs), targets)
            loss.backward()
            if probe is not None:
                probe(step, run.model, loss.detach())
            opt.step()
            scheduler.step()

    return loop


def accumulation_loop(micro_batches: int) -> Loop:
    """Gradient accumulation: each step splits its batch into ``micro_batches`` forward/backward passes."""

    def loop(run: Run, probe: StepProbe | None) -> None:
        opt = run.optimizers[0]
        for step in range(run.steps):
            inputs, targets = run.batch(step)
            opt.zero_grad()
            total = torch.zeros(())
            for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches), strict=True):
                loss = run.loss_fn(run.model(x), y) / micro_batches
                loss.backward()
                total += loss.detach()
            if probe is not None:
                probe(step, run.model, total)
            opt.step()

    return loop
