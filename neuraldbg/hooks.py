"""The only place NeuralDBG registers hooks with PyTorch.

:func:`attach` installs every module and optimizer hook of one debugger and returns a single
:class:`HookHandle`, a context manager that removes them all. Tensor hooks (:func:`on_gradient`) and the
end-of-backward callback (:func:`at_backward_end`) die with their tensors and their backward pass.

Full module backward hooks are deliberately not used: they raise on in-place operations downstream of the
module (``nn.ReLU(inplace=True)``, pytorch#61519). Gradients are read from parameters at the optimizer step,
and from tensor hooks registered on module outputs in the forward pass.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from functools import partial
from types import TracebackType
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle


class Callbacks(Protocol):
    """What the recorder implements; every method must return None (nothing in the run is changed)."""

    def on_forward_start(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None: ...

    def on_forward_end(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None: ...

    def on_layer_output(self, name: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None: ...

    def on_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...


class HookHandle:
    """Every hook of one debugger. Removing it (or leaving its ``with`` block) detaches all of them."""

    def __init__(self, handles: Iterable[RemovableHandle], model: nn.Module) -> None:
        self._handles = list(handles)
        self._model = weakref.ref(model)

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()


def attach(
    model: nn.Module, layers: Iterable[tuple[str, nn.Module]], callbacks: Callbacks, compiled: bool = False
) -> HookHandle:
    """Hook ``model``'s forward pass, each watched layer's output, and every optimizer's step.

    ``compiled``: the model runs under ``torch.compile``; its model-level hooks then run eagerly (see
    :func:`_eager`), which costs a few microseconds per call that an eager model need not pay.
    """
    handles: list[RemovableHandle] = []
    wrap = _eager if compiled else _plain
    try:
        start, end = wrap(_forward_start(callbacks)), wrap(_forward_end(callbacks))
        handles.append(model.register_forward_pre_hook(start, with_kwargs=True, prepend=True))
        handles.append(model.register_forward_hook(end, always_call=False))
        for name, module in layers:
            handles.append(module.register_forward_hook(partial(callbacks.on_layer_output, name)))
        handles.append(register_optimizer_step_pre_hook(_optimizer_step(callbacks)))
    except BaseException:
        for handle in handles:
            handle.remove()
        raise
    return HookHandle(handles, model)


def on_gradient(tensor: Tensor, fn: Callable[[Tensor], None]) -> None:
    """Call ``fn(grad)`` when the gradient w.r.t. ``tensor`` is computed. ``fn`` must return None."""
    tensor.register_hook(fn)


def at_backward_end(fn: Callable[[], None]) -> bool:
    """From inside a backward pass, run ``fn`` once that backward pass has finished. False if unsupported."""
    engine = getattr(torch.autograd.Variable, "_execution_engine", None)
    queue = getattr(engine, "queue_callback", None)
    if queue is None:
        return False
    queue(fn)
    return True


# Small factories keep the hook signatures PyTorch expects apart from the recorder's own method names.


def _eager(fn: Callable[..., None]) -> Callable[..., None]:
    """Keep torch.compile from tracing a hook: it runs eagerly at a graph break of its own.

    Used for the model-level hooks, which do the step bookkeeping in Python at the edges of the forward pass;
    per-layer hooks only do tensor work and stay traceable.
    """
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(fn) if disable is not None else fn


def _plain(fn: Callable[..., None]) -> Callable[..., None]:
    return fn


def _forward_start(cb: Callbacks) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        cb.on_forward_start(module, args, kwargs)

    return hook


def _forward_end(cb: Callbacks) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        cb.on_forward_end(module, args, output)

    return hook


def _optimizer_step(cb: Callbacks) -> Callable[..., None]:
    def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        cb.on_optimizer_step(optimizer)

    return hook
