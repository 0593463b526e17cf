"""The only place NeuralDBG registers hooks with PyTorch.

:func:`attach` installs one debugger's hooks and returns a single :class:`HookHandle`, a context manager that
removes them all. Tensor hooks (:func:`on_gradient`) and the end-of-backward callback (:func:`at_backward_end`)
die with their tensors and their backward pass.

Module hooks are *global* (``register_module_forward_hook``): they are called for every module call in the process
and the capture path recognises the watched model's modules by identity. Nothing is stored on the modules, so a
model can be pickled, saved with ``torch.save`` or deep-copied while it is watched, and a copy carries no hook.
Full module backward hooks are deliberately not used: they raise on in-place operations downstream of the module
(``nn.ReLU(inplace=True)``, pytorch#61519). Gradients are read from parameters at the optimizer step, and from
tensor hooks registered on module outputs in the forward pass.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
from torch import Tensor
from torch.nn.modules import module as _module_globals
from torch.nn.modules.module import register_module_forward_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

ModuleHook = Callable[[torch.nn.Module, tuple[Any, ...], dict[str, Any], Any], None]
OptimizerHook = Callable[[torch.optim.Optimizer, tuple[Any, ...], dict[str, Any]], None]


_GLOBAL_WITH_KWARGS: dict[int, bool] = getattr(_module_globals, "_global_forward_hooks_with_kwargs", {})

#: torch.compile warns on every compiled module call while a global module hook exists, because the hook also
#: sees the ``OptimizedModule`` wrapper; ours ignores every module it does not watch, so the warning is noise.
_COMPILE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


class HookHandle:
    """Every hook of one debugger. Removing it (or leaving its ``with`` block) detaches all of them."""

    def __init__(self, handles: list[RemovableHandle], quiet: tuple[Any, ...] | None = None) -> None:
        self._handles = handles
        self._quiet = quiet  # the warnings filter installed while attached

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def remove(self) -> None:
        while self._handles:
            handle = self._handles.pop()
            handle.remove()
            # torch registers a global hook's with_kwargs flag in a dictionary its handle does not clean up; a
            # leftover entry makes torch believe a global hook still exists (torch.compile then warns on every call)
            _GLOBAL_WITH_KWARGS.pop(handle.id, None)
        if self._quiet is not None:
            quiet, self._quiet = self._quiet, None
            filters: list[Any] = warnings.filters  # type: ignore[assignment]  # a list at run time
            if quiet not in filters:  # the user reset the filters meanwhile
                return
            filters.remove(quiet)
            mutated = getattr(warnings, "_filters_mutated", None)
            if callable(mutated):
                mutated()

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()


def attach(on_module_output: ModuleHook, on_step: OptimizerHook, on_stepped: OptimizerHook) -> HookHandle:
    """The global module forward hook (``hook(module, args, kwargs, output)``) and the optimizer step pre- and
    post-hooks (``hook(optimizer, args, kwargs)``). Every callback must return None: nothing in the run changes."""
    handles: list[RemovableHandle] = []
    try:
        handles.append(register_module_forward_hook(on_module_output, with_kwargs=True))
        handles.append(register_optimizer_step_pre_hook(on_step))
        handles.append(register_optimizer_step_post_hook(on_stepped))
    except BaseException:
        for handle in handles:
            handle.remove()
        raise
    warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
    return HookHandle(handles, warnings.filters[0])


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
