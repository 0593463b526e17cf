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

import sys
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
        #: the module hook's key in torch's global table: pass it to the next :func:`attach` of the same debugger
        self.key: int | None = handles[0].id if handles else None

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


def attach(
    on_module_output: ModuleHook, on_step: OptimizerHook, on_stepped: OptimizerHook, *, key: int | None = None
) -> HookHandle:
    """The global module forward hook (``hook(module, args, kwargs, output)``) and the optimizer step pre- and
    post-hooks (``hook(optimizer, args, kwargs)``). Every callback must return None: nothing in the run changes.

    ``key``: the :attr:`HookHandle.key` of this debugger's previous attachment. torch.compile guards on the keys
    of the global hook table; re-attaching the same callable under the same key keeps a compiled model's graphs
    valid, where a fresh key would recompile it on every ``attach()`` (and fall back to eager after 8)."""
    handles: list[RemovableHandle] = []
    try:
        handles.append(_module_hook(on_module_output, key))
        handles.append(register_optimizer_step_pre_hook(on_step))
        handles.append(register_optimizer_step_post_hook(on_stepped))
    except BaseException:
        for handle in handles:
            handle.remove()
        raise
    warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
    return HookHandle(handles, warnings.filters[0])


def _module_hook(hook: ModuleHook, key: int | None) -> RemovableHandle:
    handle = register_module_forward_hook(hook, with_kwargs=True)
    table = _module_globals._global_forward_hooks
    if key is None or key == handle.id or key in table:
        return handle
    del table[handle.id]
    _GLOBAL_WITH_KWARGS.pop(handle.id, None)
    handle.id = key
    table[key] = hook
    _GLOBAL_WITH_KWARGS[key] = True
    return handle


def compiled_entries() -> int | None:
    """How many compiled graphs torch.compile holds in memory now (None: torch.compile never ran, or its
    bookkeeping is not readable in this torch version).

    A graph Dynamo compiled while no global module hook existed does not guard on that: a hook registered later
    is never called inside it (torch 2.13: the OptimizedModule wrapper's call still sees the hook, none of its
    layers do). :func:`forget_compiled_code` makes such graphs compile again with the hook in place."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    if convert_frame is None:
        return None
    try:
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

        codes = [ref() for ref in convert_frame.input_codes.seen]
        return sum(len(_debug_get_cache_entry_list(code)) for code in codes if code is not None)
    except Exception:  # a private API that moved: assume graphs exist, so a stale one is never trusted
        return -1


def forget_compiled_code() -> None:
    """Drop torch.compile's in-memory graphs (all of them: they are keyed by code, not by model); the next call
    of each compiled function compiles again (seconds), this time seeing the debugger's hook."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset_code_caches()


def on_gradient(tensor: Tensor, fn: Callable[[Tensor], None]) -> None:
    """Call ``fn(grad)`` when the gradient w.r.t. ``tensor`` is computed. ``fn`` must return None."""
    tensor.register_hook(fn)  # type: ignore[no-untyped-call]  # untyped in torch


def at_backward_end(fn: Callable[[], None]) -> bool:
    """From inside a backward pass, run ``fn`` once that backward pass has finished. False if unsupported."""
    engine = getattr(torch.autograd.Variable, "_execution_engine", None)
    queue = getattr(engine, "queue_callback", None)
    if queue is None:
        return False
    queue(fn)
    return True
