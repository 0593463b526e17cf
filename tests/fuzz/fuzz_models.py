"""Random training runs for the property tests: models, data, optimizers and loops, drawn by hypothesis.

A run is described by a :class:`RunSpec` of plain values (hashable, printed by hypothesis when a property
fails), and :func:`build` turns it into fresh objects, the same ones every time: the model is initialised under
``torch.manual_seed(spec.seed)`` with PyTorch's default initialisation, batches depend only on (seed, step,
micro-batch), and dropout draws from a generator seeded before training. So a run can be repeated bit for bit,
with and without the debugger.

Models are built from *items* in one of four input domains:

* ``vector`` (batch, features) and ``sequence`` (batch, time, features): Linear, BatchNorm1d, LayerNorm,
  Dropout, activations (module, in-place, or ``F.relu`` inside a block's ``forward``), residual and nested
  blocks, a ReLU and a Linear each shared between several places; sequences add ``nn.MultiheadAttention``,
  LSTM, GRU and Conv1d;
* ``tokens`` (batch, time) integer ids: an ``nn.Embedding`` stem (half of them ``sparse=True``), then as
  ``sequence``;
* ``image`` (batch, channels, height, width): Conv2d, BatchNorm2d, activations, dropout, residual and nested
  blocks.

A sequence is averaged over time and an image pooled, then a few vector items and a Linear head follow. The
head's output is returned as is, in a tuple, or in a dict (with the features first or last). Optimizers: SGD
(with or without momentum), Adam, AdamW, RMSprop, and LBFGS for the fifth of the runs that step with
``optimizer.step(closure)``; batch 1-8; gradient accumulation over up to 3 micro-batches; no scheduler, StepLR,
cosine annealing or exponential decay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Union

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn

Item = Union[str, tuple[str, tuple["Item", ...]]]  # noqa: UP007  # a name, or ("residual" | "nested", items)

ACTIVATIONS = ("relu", "relu_inplace", "f_relu", "leaky_relu0", "gelu", "silu", "tanh", "sigmoid", "shared_relu")
COMMON = ("linear", "ln", "dropout", "bn", "shared_linear", *ACTIVATIONS)
SEQUENCE_ONLY = ("attention", "lstm", "gru", "conv1d")
IMAGE = ("conv2d", "bn", "dropout", "relu", "relu_inplace", "f_relu", "gelu", "tanh", "sigmoid")
IMAGE = (*IMAGE, "shared_relu", "shared_conv")
#: An in-place ReLU may follow only these: the others save their output for the backward pass (tanh, sigmoid,
#: relu, LSTM), so modifying it in place breaks autograd, in plain PyTorch as much as under a debugger.
SAFE_BEFORE_INPLACE = frozenset(
    {"stem", "linear", "shared_linear", "shared_conv", "conv1d", "conv2d", "ln", "bn", "dropout", "gelu", "silu"}
    | {"attention", "gru"}
)


@dataclass(frozen=True)
class RunSpec:
    seed: int
    domain: str  # "vector", "sequence", "tokens", "image"
    width: int
    body: tuple[Item, ...]
    neck: tuple[Item, ...]  # vector items after pooling
    task: str  # "regression" or "classification"
    outputs: int
    wrap: str  # "plain", "tuple", "dict", "dict_features_first"
    optimizer: str  # "sgd", "sgd_momentum", "adam", "adamw", "rmsprop", "lbfgs" (closure runs only)
    lr: float
    scheduler: str  # "none", "step", "cosine", "exponential"
    batch: int
    accumulation: int
    steps: int
    length: int = 4  # time steps or image side
    sparse_embedding: bool = False
    closure: bool = False


# --------------------------------------------------------------------------------------------- strategies


def _items(draw: st.DrawFn, domain: str, count: int, depth: int) -> tuple[Item, ...]:
    names = IMAGE if domain == "image" else COMMON + (SEQUENCE_ONLY if domain != "vector" else ())
    items: list[Item] = []
    for _ in range(count):
        kind = draw(st.sampled_from(("plain",) * 4 + (("residual", "nested") if depth < 2 else ())))
        if kind == "plain":
            items.append(draw(st.sampled_from(names)))
        else:
            items.append((kind, _items(draw, domain, draw(st.integers(1, 3)), depth + 1)))
    return tuple(items)


def _make_valid(items: tuple[Item, ...], previous: str, batch: int, domain: str) -> tuple[tuple[Item, ...], str]:
    """Replace what plain PyTorch would refuse: an in-place ReLU after an op that saves its output, and a
    BatchNorm1d over single samples (it needs more than one value per channel)."""
    out: list[Item] = []
    for item in items:
        if isinstance(item, tuple):
            inner, _ = _make_valid(item[1], previous, batch, domain)
            out.append((item[0], inner))
            previous = "linear" if item[0] == "residual" else "relu"  # a nested block's last op is unknown
            continue
        if item == "relu_inplace" and previous not in SAFE_BEFORE_INPLACE:
            item = "relu"
        if item == "bn" and domain == "vector" and batch < 2:
            item = "ln"
        out.append(item)
        previous = item
    return tuple(out), previous


@st.composite
def run_specs(draw: st.DrawFn) -> RunSpec:
    """A random, valid training run. Token models may have a sparse Embedding (trained with SGD, which supports
    sparse gradients); a fifth of the runs step with ``optimizer.step(closure)``, LBFGS among the optimizers."""
    domain = draw(st.sampled_from(("vector", "sequence", "tokens", "image")))
    sparse = domain == "tokens" and draw(st.booleans())
    closure = draw(st.integers(0, 4)) == 0
    batch = draw(st.integers(1, 8))
    body = _items(draw, domain, draw(st.integers(1, 5)), 0)
    neck = _items(draw, "vector", draw(st.integers(0, 2)), 1)
    body, _ = _make_valid(body, "stem", batch, domain)
    neck, _ = _make_valid(neck, "pool", batch, "vector")
    optimizers = ("sgd", "sgd_momentum") if sparse else ("sgd", "sgd_momentum", "adam", "adamw", "rmsprop")
    optimizer = draw(st.sampled_from(optimizers + (("lbfgs",) if closure and not sparse else ())))
    lrs = {"lbfgs": (0.5,)}.get(optimizer, (0.01, 0.05) if optimizer.startswith("sgd") else (1e-3, 3e-3))
    return RunSpec(
        seed=draw(st.integers(0, 2**16)),
        domain=domain,
        width=draw(st.sampled_from((4, 8, 16, 32))),
        body=body,
        neck=neck,
        task=draw(st.sampled_from(("regression", "classification"))),
        outputs=draw(st.integers(1, 3)) + 1,
        wrap=draw(st.sampled_from(("plain", "plain", "tuple", "dict", "dict_features_first"))),
        optimizer=optimizer,
        lr=draw(st.sampled_from(lrs)),
        scheduler=draw(st.sampled_from(("none", "none", "step", "cosine", "exponential"))),
        batch=batch,
        accumulation=1 if closure else draw(st.sampled_from((1, 1, 2, 3))),
        steps=draw(st.integers(12, 20)),
        length=draw(st.integers(2, 5)),
        sparse_embedding=sparse,
        closure=closure,
    )


# ------------------------------------------------------------------------------------------------- modules


class Residual(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class LinearThenFunctionalReLU(nn.Module):
    """``F.relu`` inside ``forward``: no activation module to hook."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.layer(x))


class SelfAttention(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(width, 2 if width % 2 == 0 else 1, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=False)[0]


class Recurrent(nn.Module):
    def __init__(self, cell: nn.RNNBase) -> None:
        super().__init__()
        self.rnn = cell

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


class ChannelsFirst(nn.Module):
    """Apply a channels-first layer (Conv1d, BatchNorm1d) to a (batch, time, features) sequence."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.transpose(1, 2)).transpose(1, 2)


class Chain(nn.Module):
    """Items applied in order. A ``ModuleList`` may hold one module twice: that is how sharing is written."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class FuzzNet(nn.Module):
    def __init__(self, spec: RunSpec, in_features: int) -> None:
        super().__init__()
        w, d = spec.width, spec.domain
        self.width = w
        self.shared_relu = nn.ReLU()
        self.shared_linear = nn.Linear(w, w)
        if d == "image":
            self.shared_conv = nn.Conv2d(w, w, 3, padding=1)
        if d == "tokens":
            self.stem: nn.Module = nn.Embedding(VOCAB, w, sparse=spec.sparse_embedding)
        elif d == "image":
            self.stem = nn.Conv2d(3, w, 3, padding=1)
        else:
            self.stem = nn.Linear(in_features, w)
        self.body = Chain([self._item(i, d) for i in spec.body])
        self.neck = Chain([self._item(i, "vector") for i in spec.neck])
        self.head = nn.Linear(w, spec.outputs)
        self.domain = d
        self.wrap = spec.wrap

    def _item(self, item: Item, domain: str) -> nn.Module:
        image, seq, width = domain == "image", domain in ("sequence", "tokens"), self.width
        if isinstance(item, tuple):
            inner = Chain([self._item(i, domain) for i in item[1]])
            return Residual(inner) if item[0] == "residual" else nn.Sequential(*inner.layers)
        layer: nn.Module
        if item in ("linear", "conv2d"):
            layer = nn.Conv2d(width, width, 3, padding=1) if image else nn.Linear(width, width)
        elif item == "ln":
            layer = nn.LayerNorm(width)
        elif item == "bn":
            layer = nn.BatchNorm2d(width) if image else nn.BatchNorm1d(width)
            if seq:
                layer = ChannelsFirst(layer)
        elif item == "dropout":
            layer = nn.Dropout(0.1)
        elif item == "relu":
            layer = nn.ReLU()
        elif item == "relu_inplace":
            layer = nn.ReLU(inplace=True)
        elif item == "leaky_relu0":
            layer = nn.LeakyReLU(0.0)
        elif item == "f_relu":
            inner = nn.Conv2d(width, width, 3, padding=1) if image else nn.Linear(width, width)
            layer = LinearThenFunctionalReLU(inner)
        elif item == "gelu":
            layer = nn.GELU()
        elif item == "silu":
            layer = nn.SiLU()
        elif item == "tanh":
            layer = nn.Tanh()
        elif item == "sigmoid":
            layer = nn.Sigmoid()
        elif item == "shared_relu":
            layer = self.shared_relu
        elif item == "shared_linear":
            layer = self.shared_linear
        elif item == "shared_conv":
            layer = self.shared_conv
        elif item == "attention":
            layer = SelfAttention(width)
        elif item in ("lstm", "gru"):
            layer = Recurrent((nn.LSTM if item == "lstm" else nn.GRU)(width, width, batch_first=True))
        elif item == "conv1d":
            layer = ChannelsFirst(nn.Conv1d(width, width, 3, padding=1))
        else:  # pragma: no cover - a typo in the item lists
            raise ValueError(item)
        return layer

    def forward(self, x: torch.Tensor) -> Any:
        h = self.body(self.stem(x))
        if self.domain == "image":
            h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        elif self.domain != "vector":
            h = h.mean(dim=1)
        features = self.neck(h)
        out = self.head(features)
        if self.wrap == "tuple":
            return out, features
        if self.wrap == "dict":
            return {"out": out, "features": features}
        if self.wrap == "dict_features_first":
            return {"features": features, "out": out}
        return out


def main_output(output: Any) -> torch.Tensor:
    """The tensor the loss is computed from."""
    if isinstance(output, tuple):
        return output[0]
    if isinstance(output, dict):
        return output["out"]
    return output


# ---------------------------------------------------------------------------------------------------- runs

VOCAB = 20
IN_FEATURES = 6


@dataclass
class BuiltRun:
    spec: RunSpec
    model: FuzzNet
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]

    def loss(self, output: Any, target: torch.Tensor) -> torch.Tensor:
        out = main_output(output)
        if self.spec.task == "classification":
            return F.cross_entropy(out, target)
        return F.mse_loss(out, target)


def _generator(*parts: int) -> torch.Generator:
    seed = 0
    for p in parts:
        seed = seed * 1_000_003 + p
    return torch.Generator().manual_seed(seed % (2**63))


def _data(spec: RunSpec) -> Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]:
    """Batches that depend only on (seed, step, micro-batch); targets from a fixed random teacher."""
    g = _generator(spec.seed, 1)
    teacher = torch.randn(IN_FEATURES if spec.domain != "image" else 3, spec.outputs, generator=g)
    token_values = torch.randn(VOCAB, IN_FEATURES, generator=g)

    def batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        gs = _generator(spec.seed, 2, step, micro)
        n, t = spec.batch, spec.length
        if spec.domain == "vector":
            x = torch.randn(n, IN_FEATURES, generator=gs)
            summary = x
        elif spec.domain == "sequence":
            x = torch.randn(n, t, IN_FEATURES, generator=gs)
            summary = x.mean(dim=1)
        elif spec.domain == "tokens":
            x = torch.randint(0, VOCAB, (n, t), generator=gs)
            summary = token_values[x].mean(dim=1)
        else:
            x = torch.randn(n, 3, t + 2, t + 2, generator=gs)
            summary = x.mean(dim=(2, 3))
        score = summary @ teacher
        y = score.argmax(dim=1) if spec.task == "classification" else torch.tanh(score)
        return x, y

    return batch


def build(spec: RunSpec) -> BuiltRun:
    """Fresh model, optimizer, scheduler and data for ``spec`` (the same every call)."""
    torch.manual_seed(spec.seed)
    model = FuzzNet(spec, IN_FEATURES)
    params = model.parameters()
    opt: torch.optim.Optimizer
    if spec.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=spec.lr)
    elif spec.optimizer == "sgd_momentum":
        opt = torch.optim.SGD(params, lr=spec.lr, momentum=0.9)
    elif spec.optimizer == "adam":
        opt = torch.optim.Adam(params, lr=spec.lr)
    elif spec.optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.01)
    elif spec.optimizer == "lbfgs":
        opt = torch.optim.LBFGS(params, lr=spec.lr, max_iter=4, history_size=5, line_search_fn="strong_wolfe")
    else:
        opt = torch.optim.RMSprop(params, lr=spec.lr)
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    if spec.scheduler == "step":
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    elif spec.scheduler == "cosine":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=spec.steps)
    elif spec.scheduler == "exponential":
        scheduler = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    return BuiltRun(spec, model, opt, scheduler, _data(spec))


class Observer:
    """Called by :func:`train` around each optimizer step (the plain-torch oracle is one)."""

    def before_step(self, step: int, loss: float) -> None: ...

    def after_step(self, step: int) -> None: ...


def _closure(run: BuiltRun, step: int, seen: list[float], observer: Observer | None) -> torch.Tensor:
    """What ``optimizer.step(closure)`` calls (LBFGS calls it several times a step): a full forward/backward."""
    run.optimizer.zero_grad()
    x, y = run.batch(step, 0)
    loss = run.loss(run.model(x), y)
    loss.backward()
    if not seen:
        seen.append(float(loss.detach()))
        if observer is not None:
            observer.before_step(step, seen[0])
    return loss


def train(run: BuiltRun, observer: Observer | None = None) -> list[float]:
    """The training loop, identical with and without a debugger; returns the loss of each step."""
    spec, model, opt = run.spec, run.model, run.optimizer
    torch.manual_seed(spec.seed + 1)  # dropout draws from here, the same in every run of this spec
    losses: list[float] = []
    for step in range(spec.steps):
        if spec.closure:
            seen: list[float] = []
            opt.step(partial(_closure, run, step, seen, observer))
            losses.append(seen[0])
        else:
            opt.zero_grad()
            total = 0.0
            for micro in range(spec.accumulation):
                x, y = run.batch(step, micro)
                loss = run.loss(model(x), y) / spec.accumulation
                loss.backward()
                total += float(loss.detach())
            if observer is not None:
                observer.before_step(step, total)
            opt.step()
            losses.append(total)
        if observer is not None:
            observer.after_step(step)
        if run.scheduler is not None:
            run.scheduler.step()
    return losses


def items_of(spec: RunSpec) -> Iterator[str]:
    """Every item name in the spec, nested ones included."""

    def walk(items: tuple[Item, ...]) -> Iterator[str]:
        for item in items:
            if isinstance(item, tuple):
                yield item[0]
                yield from walk(item[1])
            else:
                yield item

    yield from walk(spec.body)
    yield from walk(spec.neck)


def describe(spec: RunSpec) -> str:
    """One line naming the run, for failure messages and the campaign log."""
    return (
        f"{spec.domain} w{spec.width} body={spec.body} neck={spec.neck} {spec.task} {spec.wrap} "
        f"{spec.optimizer}(lr={spec.lr:g}) sched={spec.scheduler} batch={spec.batch}x{spec.accumulation} "
        f"steps={spec.steps} seed={spec.seed}"
        + (" sparse" if spec.sparse_embedding else "")
        + (" closure" if spec.closure else "")
    )
