"""``smoke_train``: a short, seeded, deterministic training loop run under a debugger.

Imported lazily by the fixture (it imports torch).
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .errors import ArgumentError, ArgumentTypeError, hide_usage_problems

Batch = Any
Data = Iterable[Batch] | Callable[[int], Batch]
OptimizerArg = torch.optim.Optimizer | Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None


def batches(data: Data, *, overfit: bool = False) -> Iterator[Batch]:
    """Batches forever: ``data`` is cycled when it runs out; a callable is asked ``data(step)``.

    A one-shot iterator (a generator) is remembered on its first pass and replayed, so it can be cycled too.
    With ``overfit`` the first batch is repeated for ever (the "overfit one batch" check).
    """
    __tracebackhide__ = hide_usage_problems
    if overfit:
        first = next(batches(data))
        while True:
            yield first
    if callable(data) and not isinstance(data, Iterable):
        step = 0
        while True:
            yield data(step)
            step += 1
    if not isinstance(data, Iterable):
        raise ArgumentTypeError(
            f"smoke_train(): data must be an iterable of (inputs, targets) batches, a DataLoader or a callable "
            f"step -> batch, got {type(data).__name__}"
        )
    if iter(data) is data:  # a one-shot iterator: remember its batches to replay them
        seen: list[Batch] = []
        for batch in data:
            seen.append(batch)
            yield batch
        if not seen:
            raise ArgumentError("smoke_train(): data yielded no batches")
        while True:
            yield from seen
    while True:
        count = 0
        for batch in data:
            count += 1
            yield batch
        if count == 0:
            raise ArgumentError("smoke_train(): data yielded no batches")


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, Mapping):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _forward(model: nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (list, tuple)):
        return model(*inputs)
    return model(inputs)


def _split(batch: Batch) -> tuple[Any, Any]:
    __tracebackhide__ = True
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ArgumentTypeError(
        f"smoke_train(): each batch must be an (inputs, targets) pair, got {type(batch).__name__}"
        + (f" of length {len(batch)}" if isinstance(batch, (list, tuple)) else "")
    )


def _optimizer(optimizer: OptimizerArg, model: nn.Module) -> torch.optim.Optimizer:
    __tracebackhide__ = hide_usage_problems
    if optimizer is None:
        return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if callable(optimizer):
        made = optimizer(model.parameters())
        if not isinstance(made, torch.optim.Optimizer):
            raise ArgumentTypeError(
                f"smoke_train(): the optimizer factory must return a torch.optim.Optimizer, got {type(made).__name__}"
            )
        return made
    raise ArgumentTypeError(
        f"smoke_train(): optimizer must be a torch.optim.Optimizer or a callable params -> optimizer, "
        f"got {type(optimizer).__name__}"
    )


def loader_generators(data: Any) -> list[torch.Generator]:
    """The generators a DataLoader given its own ``generator`` draws its shuffling and worker seeds from.

    A DataLoader without one draws them from torch's global generator, which :class:`_Seeded` seeds anyway.
    """
    if not isinstance(data, torch.utils.data.DataLoader):
        return []
    batch_sampler = getattr(data, "batch_sampler", None)
    found: list[torch.Generator] = []
    for owner in (data, getattr(data, "sampler", None), getattr(batch_sampler, "sampler", None)):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
            found.append(generator)
    return found


class _Seeded:
    """Seed torch, random, numpy (when installed) and the given generators; restore their states on exit."""

    def __init__(self, seed: int, generators: Iterable[torch.Generator] = ()) -> None:
        self.seed = seed
        self.generators = list(generators)

    def __enter__(self) -> None:
        self._generators = [(g, g.get_state()) for g in self.generators]
        for generator in self.generators:
            generator.manual_seed(self.seed)
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []  # type: ignore[no-untyped-call]
        self._torch = torch.random.fork_rng(devices=devices)
        self._torch.__enter__()
        self._random = random.getstate()
        try:
            numpy = importlib.import_module("numpy")
        except ImportError:
            self._numpy: Any = None
        else:
            self._numpy = (numpy, numpy.random.get_state())
            numpy.random.seed(self.seed % 2**32)
        random.seed(self.seed)
        torch.manual_seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        for generator, state in self._generators:
            generator.set_state(state)
        random.setstate(self._random)
        if self._numpy is not None:
            numpy, state = self._numpy
            numpy.random.set_state(state)
        self._torch.__exit__(None, None, None)


def check_arguments(model: Any, loss_fn: Any, steps: Any, overfit: Any) -> None:
    """Refuse what ``smoke_train`` cannot train, before anything runs; the message names the argument."""
    __tracebackhide__ = True
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ArgumentError(f"smoke_train(): steps must be a positive integer, got {steps!r}")
    if not isinstance(overfit, bool):
        raise ArgumentTypeError(f"smoke_train(): overfit must be True or False, got {overfit!r}")
    if not isinstance(model, nn.Module):
        raise ArgumentTypeError(f"smoke_train(): model must be a torch.nn.Module, got {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        has = "has no parameters" if next(iter(model.parameters()), None) is None else "has no trainable parameters"
        raise ArgumentError(
            f"smoke_train(): the model ({type(model).__name__}) {has} (none with requires_grad=True), so there is "
            "nothing to train; pass a model with trainable layers"
        )
    if not callable(loss_fn):
        raise ArgumentTypeError(
            f"smoke_train(): loss_fn must be a callable (outputs, targets) -> loss, got {type(loss_fn).__name__}"
        )


def _checked_loss(loss: Any) -> torch.Tensor:
    __tracebackhide__ = True
    if not isinstance(loss, torch.Tensor):
        raise ArgumentTypeError(f"smoke_train(): loss_fn must return a tensor, got {type(loss).__name__}")
    if loss.numel() != 1:
        raise ArgumentError(
            f"smoke_train(): loss_fn must return a single number (a tensor of one element), got shape "
            f"{tuple(loss.shape)}; reduce it, e.g. with .mean()"
        )
    if not loss.requires_grad:
        raise ArgumentError(
            "smoke_train(): the loss does not require grad: it does not depend on any trainable parameter "
            "(was it computed under torch.no_grad(), or detached?)"
        )
    return loss


def train(
    dbg: Any,
    model: nn.Module,
    data: Data,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    *,
    optimizer: OptimizerArg = None,
    steps: int,
    seed: int = 0,
    overfit: bool = False,
    progress: Callable[[int, Any], None] | None = None,
) -> Any:
    """Train ``model`` for ``steps`` optimizer steps under ``dbg`` and return ``dbg``, closed.

    ``progress``: called after each step with the step's number (from 1) and its loss tensor.

    Each step: ``zero_grad``, ``loss_fn(model(inputs), targets)``, ``observe_loss``, ``backward``, ``step``.
    Inputs that are a tuple or a dict are unpacked into the model's arguments; tensors are moved to the model's
    device. With ``overfit`` every step trains on the first batch. Seeded for the loop (states restored after):
    torch's global generator (which also drives a DataLoader's shuffling and worker seeds), ``random``, numpy,
    and a DataLoader's own ``generator`` when it has one. The model is left in the mode (train/eval) it was in.
    Bad arguments raise :class:`~pytest_neuraldbg.errors.UsageProblem` errors (``ValueError``/``TypeError``).
    """
    __tracebackhide__ = hide_usage_problems
    check_arguments(model, loss_fn, steps, overfit)
    first = next(iter(model.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    was_training = model.training
    with _Seeded(seed, loader_generators(data)):
        opt = _optimizer(optimizer, model)
        source = batches(data, overfit=overfit)
        model.train()
        try:
            with dbg:
                for step in range(steps):
                    inputs, targets = _split(next(source))
                    opt.zero_grad(set_to_none=True)
                    loss = _checked_loss(loss_fn(_forward(model, _to(inputs, device)), _to(targets, device)))
                    dbg.observe_loss(loss)
                    loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch
                    opt.step()
                    if progress is not None:
                        progress(step + 1, loss.detach())
        finally:
            model.train(was_training)
    return dbg
