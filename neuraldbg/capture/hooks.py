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

Backward calls: while a debugger is attached, ``torch.autograd.backward`` (which ``Tensor.backward`` calls) is
wrapped, so each backward pass of the process is seen from its start, with the loss it starts from, and from its
end (:func:`on_backward_calls`): that is how the loss of a user's own loop is recorded without ``observe_loss``,
and how gradients left over from the previous optimizer step are proved.

Model calls: while a debugger is attached, ``nn.Module.__call__`` is wrapped too (:func:`on_model_calls`), so the
watched model's own call is seen from its start. On a cheap step the module hook sits that call out
(:meth:`HookHandle.mute`): with no global hook in torch's table every layer runs on torch's fast path, and the
wrapper keeps the layers' outputs itself.
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from types import MethodType, TracebackType
from typing import Any

import torch
from torch import Tensor
from torch.nn.modules import module as _module_globals
from torch.nn.modules.module import register_module_forward_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

#: The oldest torch release NeuralDBG runs on: the oldest whose whole test suite passes (run by hand, see
#: docs/limitations.md). Older releases lack what the hooks use (torch 2.1: a global forward hook's keyword
#: arguments, torch.compile's cache entries) or fail its tests (torch 2.6: FSDP2 does not run on CPU processes,
#: layers inside a graph compiled before the hook existed call it, several runs' numbers differ).
OLDEST_TORCH = (2, 8)


def torch_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string ("2.9.1+cu128" -> (2, 9)); None when it does not start so."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else None


def require_torch(version: str) -> None:
    """Refuse, with the way out, a torch older than :data:`OLDEST_TORCH` (pip enforces the same floor; this is for
    an environment that got its torch another way). A version that cannot be read is let through."""
    release = torch_release(version)
    if release is not None and release < OLDEST_TORCH:
        oldest = ".".join(map(str, OLDEST_TORCH))
        raise ImportError(
            f"NeuralDBG needs torch {oldest} or later, and torch.__version__ is {version!r}: "
            f"upgrade it (pip install 'torch>={oldest}')"
        )


require_torch(str(torch.__version__))

ModuleHook = Callable[[torch.nn.Module, tuple[Any, ...], dict[str, Any], Any], None]
#: ``(model, its modules to their names (the model's own entry ignored), start, end, the list a muted call's layer
#: outputs go to)``: see :func:`on_model_calls`
ModelCalls = tuple[torch.nn.Module, dict[torch.nn.Module, str], Any, Any, list[tuple[str, Any]]]
OptimizerHook = Callable[[torch.optim.Optimizer, tuple[Any, ...], dict[str, Any]], None]


_GLOBAL_WITH_KWARGS: dict[int, bool] = getattr(_module_globals, "_global_forward_hooks_with_kwargs", {})

#: torch.compile warns on every compiled module call while a global module hook exists, because the hook also
#: sees the ``OptimizedModule`` wrapper; ours ignores every module it does not watch, so the warning is noise.
_COMPILE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


class HookHandle:
    """Every hook of one debugger. Removing it (or leaving its ``with`` block) detaches all of them."""

    def __init__(self, handles: list[Any], quiet: tuple[Any, ...] | None = None) -> None:
        self._handles = handles
        self._quiet = quiet  # the warnings filter installed while attached
        #: the module hook's key in torch's global table: pass it to the next :func:`attach` of the same debugger
        self.key: int | None = handles[0].id if handles else None
        self._module_hook: ModuleHook | None = None  # held while the module hook sits a model call out (see mute)
        #: whether the module hook sits a model call out now (see :meth:`mute`; read on every layer call then)
        self.muted = False
        self._after_it: list[int] = []

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def mute(self) -> bool:
        """Take the module hook out of torch's global table until :meth:`unmute` (a model call that runs without
        it: with no global module hook, torch calls every module on its fast path). False when it is not there."""
        table = _module_globals._global_forward_hooks
        if self._module_hook is not None or self.key is None or self.key not in table:
            return False
        # its with_kwargs flag stays: another thread that took the table's hooks just before still calls it with
        # the keyword arguments, and a flag without a hook costs torch nothing
        keys = list(table)
        self._after_it = keys[keys.index(self.key) + 1 :]  # the hooks registered after it, put back after it
        self._module_hook = table.pop(self.key)
        self.muted = True
        return True

    def unmute(self) -> None:
        """Put the module hook back under its key, where it was in the table (torch.compile's guards, and the
        hooks of others that modify an output, see the same table as before)."""
        hook, self._module_hook = self._module_hook, None
        self.muted = False
        if hook is not None and self.key is not None and self._handles:
            table = _module_globals._global_forward_hooks
            table[self.key] = hook
            for key in self._after_it:
                if key in table:
                    table[key] = table.pop(key)  # to the end

    def remove(self) -> None:
        self._module_hook = None
        self.muted = False
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
    on_module_output: ModuleHook,
    on_step: OptimizerHook,
    on_stepped: OptimizerHook,
    *,
    key: int | None = None,
    on_backward: BackwardListener | None = None,
    model_calls: ModelCalls | None = None,
) -> HookHandle:
    """The global module forward hook (``hook(module, args, kwargs, output)``), the optimizer step pre- and
    post-hooks (``hook(optimizer, args, kwargs)``) and, when given, a backward-call listener (see
    :func:`on_backward_calls`) and the model's own calls (``(model, layers, start, end, seen)``, see
    :func:`on_model_calls`).
    Every callback must return None (a model call's ``start`` a bool): nothing in the run changes.

    ``key``: the :attr:`HookHandle.key` of this debugger's previous attachment. torch.compile guards on the keys
    of the global hook table; re-attaching the same callable under the same key keeps a compiled model's graphs
    valid, where a fresh key would recompile it on every ``attach()`` (and fall back to eager after 8)."""
    handles: list[Any] = []
    result = HookHandle(handles)
    try:
        handles.append(_module_hook(on_module_output, key))
        handles.append(register_optimizer_step_pre_hook(on_step))
        handles.append(register_optimizer_step_post_hook(on_stepped))
        if on_backward is not None:
            handles.append(on_backward_calls(on_backward))
        if model_calls is not None:
            handles.append(on_model_calls(*model_calls, result))
    except BaseException:
        for handle in handles:
            handle.remove()
        raise
    warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
    result.key = handles[0].id
    result._quiet = warnings.filters[0]
    return result


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


def compiled_graphs() -> frozenset[str] | None:
    """Which compiled graphs torch.compile holds in memory now, each by its compile id (None: torch.compile never
    ran). When its bookkeeping is not readable in this torch version, a set never seen before: a graph that may be
    stale is never trusted.

    A graph Dynamo compiled while no global module hook existed does not guard on that: a hook registered later
    is never called inside it (torch 2.13: the OptimizedModule wrapper's call still sees the hook, none of its
    layers do). :func:`forget_compiled_code` makes such graphs compile again with the hook in place. Graphs are
    told apart by identity, not counted: another debugger's phase, or a plain compiled copy's, may replace graphs
    one for one while this debugger is detached."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    if convert_frame is None:
        return None
    try:
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

        codes = [ref() for ref in convert_frame.input_codes.seen]
        return frozenset(
            str(entry.compile_id) for code in codes if code is not None for entry in _debug_get_cache_entry_list(code)
        )
    except Exception:  # a private API that moved
        return frozenset({f"unreadable {next(_unreadable)}"})


_unreadable = itertools.count()


def compiled_any() -> bool:
    """Whether torch.compile has compiled anything in this process (True when that cannot be read)."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    if convert_frame is None:
        return False
    try:
        return bool(convert_frame.input_codes.seen)
    except Exception:  # a private API that moved
        return True


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


# --- backward calls -----------------------------------------------------------------------------------------

#: ``listener(loss)`` is called when ``torch.autograd.backward`` (``Tensor.backward`` goes through it) is about to
#: run, with the loss the backward pass starts from (see :func:`loss_of`) or None; it returns what to call once the
#: backward pass is over (``after(completed)``), or None.
BackwardListener = Callable[[Tensor | None], Callable[[bool], None] | None]

_backward_listeners: list[BackwardListener] = []
_original_backward: Callable[..., Any] | None = None
_nesting = threading.local()


def loss_of(tensors: Any, grad_tensors: Any) -> Tensor | None:
    """The loss a backward call starts from: a floating tensor of one element that requires a gradient, called
    without an explicit gradient (``loss.backward()``, ``scaler.scale(loss).backward()``), or the sum of several
    such roots (``torch.autograd.backward([l1, l2])``). None for anything else: a non-scalar root with
    ``gradient=...`` (a vector-Jacobian product, a manual chain rule) is not a loss."""
    roots = [tensors] if isinstance(tensors, Tensor) else list(tensors) if isinstance(tensors, (list, tuple)) else []
    if not roots:
        return None
    if grad_tensors is not None:
        given = [grad_tensors] if isinstance(grad_tensors, Tensor) else list(grad_tensors)
        if any(g is not None for g in given):
            return None
    total: Tensor | None = None
    for root in roots:
        if not (isinstance(root, Tensor) and root.requires_grad and root.numel() == 1 and root.is_floating_point()):
            return None
        value = root.detach()
        if value.dim():
            value = value.reshape(())
        if value.dtype is not torch.float32:
            value = value.float()
        total = value if total is None else total + value
    return total


def _backward(*args: Any, **kwargs: Any) -> Any:
    """``torch.autograd.backward`` while a debugger is attached: the listeners see each outermost call."""
    original = _original_backward
    assert original is not None
    listeners = _backward_listeners
    if not listeners or getattr(_nesting, "inside", False) or torch.compiler.is_compiling():
        return original(*args, **kwargs)
    tensors = args[0] if args else kwargs.get("tensors")
    grads = args[1] if len(args) > 1 else kwargs.get("grad_tensors", kwargs.get("grad_variables"))
    afters: list[Callable[[bool], None]] = []
    try:
        loss = loss_of(tensors, grads)
        _nesting.roots = tensors if loss is not None else None  # for backward_roots(), during the listeners only
        for listener in list(listeners):
            after = listener(loss)
            if after is not None:
                afters.append(after)
    except Exception:  # a listener's own failure; each listener reports its failures itself
        pass
    finally:
        _nesting.roots = None
    _nesting.inside = True
    completed = False
    try:
        result = original(*args, **kwargs)
        completed = True
        return result
    finally:
        _nesting.inside = False
        for after in afters:
            after(completed)


def backward_roots() -> list[Tensor]:
    """Inside a backward listener: the loss tensors the backward call starts from, undetached (their autograd
    graph), when :func:`loss_of` found a loss in them; ``[]`` otherwise."""
    roots = getattr(_nesting, "roots", None)
    if roots is None:
        return []
    return [roots] if isinstance(roots, Tensor) else [r for r in roots if isinstance(r, Tensor)]


def on_backward_calls(listener: BackwardListener) -> _ListenerHandle:
    """Call ``listener`` at every outermost ``torch.autograd.backward`` call of the process (``loss.backward()``,
    Lightning's and the Trainer's backward, ``scaler.scale(loss).backward()``); see :data:`BackwardListener`.

    ``torch.autograd.backward`` is replaced by a thin wrapper while at least one listener is registered, and put
    back when the last one is removed (unless something replaced it meanwhile: the wrapper then stays, idle). The
    wrapper passes every argument through unchanged; calls nested inside a backward pass (reentrant checkpointing)
    and calls traced by torch.compile go straight to torch. ``torch.autograd.grad`` (gradient penalties) is not a
    backward call and is not seen."""
    global _original_backward
    if not _backward_listeners and torch.autograd.backward is not _backward:
        _original_backward = torch.autograd.backward
        functools.update_wrapper(_backward, _original_backward)
        torch.autograd.backward = _backward
    _backward_listeners.append(listener)
    return _ListenerHandle(listener)


class _ListenerHandle:
    """Removes one backward listener (and the wrapper with the last one)."""

    id = None  # not in torch's table of module hooks

    def __init__(self, listener: BackwardListener) -> None:
        self._listener: BackwardListener | None = listener

    def remove(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None and listener in _backward_listeners:
            _backward_listeners.remove(listener)
        if not _backward_listeners and torch.autograd.backward is _backward and _original_backward is not None:
            torch.autograd.backward = _original_backward


# --- the watched model's own calls, and its layers' while the module hook sits a call out ----------------------

#: ``start(model, args, kwargs)`` is called as a watched model's own call (``model(x)``) begins; True: the module
#: hook sits the call out (see :meth:`HookHandle.mute`) and ``end(model, args, kwargs, output)`` is called as it
#: returns, in its stead; the outputs of the model's layers in that call are appended to a list, ``(name, output)``.
ModelCallStart = Callable[[torch.nn.Module, tuple[Any, ...], dict[str, Any]], bool]
ModelCallEnd = Callable[[torch.nn.Module, tuple[Any, ...], dict[str, Any], Any], None]


class _Root:
    """A watched model: its callbacks, its debugger's hooks, and how deep in its own calls the process is."""

    __slots__ = ("depth", "end", "handle", "reentered", "ref", "start")

    def __init__(self, model: torch.nn.Module, start: ModelCallStart, end: ModelCallEnd, handle: HookHandle) -> None:
        self.ref = weakref.ref(model)
        self.start, self.end, self.handle = start, end, handle
        self.depth = 0
        self.reentered = False  # called inside its own call once (a forward calling ``self`` on chunks): never muted


class _Layer:
    """A layer of a watched model: its name, its debugger's hooks and where its outputs go while they are out."""

    __slots__ = ("handle", "name", "ref", "seen", "thread")

    def __init__(self, module: torch.nn.Module, name: str, handle: HookHandle, seen: list[tuple[str, Any]]) -> None:
        self.ref = weakref.ref(module)
        self.name, self.handle, self.seen = name, handle, seen
        self.thread = threading.get_ident()  # the training thread (another one may serve predictions meanwhile)


_roots: dict[int, _Root] = {}  # by the model's identity
_layers: dict[int, list[_Layer]] = {}  # by the layer's identity: one entry per debugger watching it
#: ``nn.Module.__call__`` as it was before the debugger wrapped it, while wrapped
_module_call: list[Callable[..., Any]] = []
_compiling = torch.compiler.is_compiling
_get_ident = threading.get_ident
_grad_enabled = torch.is_grad_enabled


def on_model_calls(
    model: torch.nn.Module,
    layers: dict[torch.nn.Module, str],
    start: ModelCallStart,
    end: ModelCallEnd,
    seen: list[tuple[str, Any]],
    handle: HookHandle,
) -> Any:
    """See a watched model's own calls from their start, and its layers' outputs in the calls the module hook sits
    out: ``nn.Module.__call__`` is wrapped while a debugger is attached (one Python call more per module call of
    the process, where a global module hook sends every one of them down torch's slow path); the wrapper looks the
    module up by identity and otherwise passes the call through. Calls traced by torch.compile go straight to
    torch; torch.fx replaces ``nn.Module.__call__`` while it traces, as it always does. Nothing is stored on the
    modules: they pickle and deep-copy as they are, and a module whose class changes (a lazy layer, a
    parametrisation) is still seen. ``model.forward(x)`` called directly, and a model that is never called itself
    (its submodules called one by one), are not seen here: the module hook sees their layers as before. A model a
    debugger watches already is left to that one."""
    mine: list[tuple[int, Any]] = []
    if id(model) not in _roots:
        root = _Root(model, start, end, handle)
        _roots[id(model)] = root
        mine.append((id(model), root))
    for module, name in layers.items():
        if module is not model:
            layer = _Layer(module, name, handle, seen)
            _layers.setdefault(id(module), []).append(layer)
            mine.append((id(module), layer))
    if not _module_call:
        _module_call.append(torch.nn.Module.__call__)
        torch.nn.Module.__call__ = _watched_call  # type: ignore[method-assign]
    return _ModelCallsHandle(mine)


def _watched_call(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``nn.Module.__call__`` while a debugger is attached. When what it wrapped is torch's own ``__call__`` (not
    something else that wrapped that before), torch's one step there, to the module's compiled call if
    ``module.compile()`` made one and to its ``_call_impl`` otherwise, is taken here: a Python call less per module
    call (about 1.8k instructions of the wrapper's 4.2k; see :data:`_steppable`)."""
    call = _module_call[0] if _module_call else _torch_call
    if _compiling():
        return call(self, *args, **kwargs)
    impl: Any  # the call torch makes next: the compiled one or _call_impl (a bound method, untyped)
    if call is _steppable:
        compiled = self._compiled_call_impl
        impl = self._call_impl if compiled is None else compiled
    else:
        impl = MethodType(call, self)
    key = id(self)
    root = _roots.get(key)
    if root is None or root.ref() is not self:
        output = impl(*args, **kwargs)
    elif root.depth:  # the model called inside its own call: each such call is a pass, as the module hook sees it
        root.reentered = True
        output = impl(*args, **kwargs)
    else:
        muted = not root.reentered and root.start(self, args, kwargs) and root.handle.mute()
        root.depth += 1
        try:
            output = impl(*args, **kwargs)
        finally:
            root.depth -= 1
            if muted:
                root.handle.unmute()
        if muted:
            root.end(self, args, kwargs, output)
    layers = _layers.get(key)
    if layers is not None:
        for layer in layers:
            if layer.handle.muted and layer.ref() is self and _get_ident() == layer.thread and _grad_enabled():
                layer.seen.append((layer.name, output))
    return output


#: torch's own ``nn.Module.__call__`` (whatever ``__call__`` is now): what the wrapper falls back to if unwrapped
#: meanwhile, and the one whose step it takes itself (see :func:`_watched_call`)
_torch_call = torch.nn.Module._wrapped_call_impl
#: ... while that step is all it does: its code names the compiled call and ``_call_impl`` and nothing else (a torch
#: whose ``__call__`` does more is called as it is, one Python call more)
_steppable = _torch_call if set(_torch_call.__code__.co_names) == {"_compiled_call_impl", "_call_impl"} else None


class _ModelCallsHandle:
    """Stops seeing one debugger's model and layers (and unwraps ``nn.Module.__call__`` with the last one)."""

    id = None  # not in torch's table of module hooks

    def __init__(self, mine: list[tuple[int, Any]]) -> None:
        self._mine = mine

    def remove(self) -> None:
        mine, self._mine = self._mine, []
        for key, entry in mine:
            if isinstance(entry, _Root):
                if _roots.get(key) is entry:
                    del _roots[key]
                continue
            found = _layers.get(key)
            if found is not None and entry in found:
                found.remove(entry)
                if not found:
                    del _layers[key]
        if _roots or _layers or not _module_call:
            return
        before = _module_call.pop()
        if torch.nn.Module.__dict__.get("__call__") is _watched_call:
            torch.nn.Module.__call__ = before  # type: ignore[method-assign]
        # else something replaced it after us: that stays, and ours passes every call through if it is still called
