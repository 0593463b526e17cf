"""From hook callbacks to per-step records.

The :class:`Recorder` receives the hook callbacks of :mod:`neuraldbg.hooks`, decides what one *training step*
is, computes the statistics of :mod:`neuraldbg.stats` on device, and hands batches of host-side
:class:`StepData` records to a sink. It keeps no raw tensors beyond the current step.

Steps. One step is one forward/backward cycle closed by the steps of the optimizers that own the model's
parameters: the step is committed when the next training forward starts (so several optimizers, or gradient
accumulation over several micro-batches, make one step). Until an optimizer is seen, each backward pass is
provisionally a step; if an optimizer then steps, those provisional steps are folded into one (they were
micro-batches of gradient accumulation). If no optimizer ever steps, a step is one backward pass. Calling
``step()`` switches to manual counting. Forward passes under ``torch.no_grad()`` or in eval mode are ignored.

Cost. Every step: one list append per layer output; on a CPU, the norm of the model's output when the forward
pass ends (every layer's output only when it is non-finite) and one element of the head layer's gradient at the
optimizer step; on a GPU, every layer output's norm, batched, read at the flush; the learning rates. Fully
observed steps (see :mod:`neuraldbg.schedule`) add every layer output's norm, the loss gradient, parameter-gradient
norms (also before clipping, where clipping may happen), per-unit activity of ReLU-family outputs, saturation of
bounded outputs and parameter updates.
"""

from __future__ import annotations

import ctypes
import math
import warnings
import weakref
from collections.abc import Callable
from enum import Enum
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from . import hooks, stats
from .config import DebugConfig
from .errors import NeuralDbgWarning
from .layers import LayerInfo, Role
from .schedule import Schedule
from .stepdata import Pending, SlotKey, StepData, assign, merge_max

#: Provisional (per-backward) steps held before concluding that no optimizer will step.
_PROVISIONAL_LIMIT = 64
#: Committed steps held before a flush even when no fully observed step comes.
_BUFFER_LIMIT = 64


class StepMode(str, Enum):
    UNKNOWN = "unknown"  # no optimizer step seen yet; backward passes are provisional steps
    OPTIMIZER = "optimizer"
    BACKWARD = "backward"
    MANUAL = "manual"


class Recorder:
    """Collects statistics of one model's training steps. See the module docstring."""

    def __init__(
        self,
        model: nn.Module,
        infos: dict[str, LayerInfo],
        config: DebugConfig,
        sink: Callable[[list[StepData]], bool | None],
        order: list[SlotKey] | None = None,
    ) -> None:
        self._infos = infos
        self._config = config
        self._sink = sink
        self._schedule = Schedule(config)
        self._params: list[tuple[str, nn.Parameter]] = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._by_name = dict(self._params)
        self._owned: dict[int, tuple[weakref.ref[torch.optim.Optimizer], int, frozenset[str]]] = {}
        self._last_optimizer: torch.optim.Optimizer | None = None  # fast path for the common single optimizer
        self._last_size = -1
        self._last_owned: frozenset[str] = frozenset()
        self._lr_seen: dict[int, list[Any]] = {}  # optimizer id -> its groups' learning rates at the last step
        self.active = True
        self.mode = StepMode.UNKNOWN
        self.step = 0
        self.order: list[SlotKey] = order if order is not None else []  # forward order of layer outputs
        self._order_set: set[SlotKey] = set()
        self._next_role: dict[SlotKey, Role] = {}
        self._order_seen = 0
        self._order_known = False  # the forward order is complete (what comes after a layer is known)
        self._pending = Pending(0, self._schedule.is_full(0))
        self._full = self._pending.data.full  # the step in progress is fully observed
        self._buffer: list[Pending] = []
        self._provisional = 0
        self._in_forward = False
        self._calls: dict[str, int] = {}
        self._refs: dict[SlotKey, Tensor] = {}  # layer outputs of a fully observed step
        self._seen: list[tuple[str, Any]] = []  # raw layer outputs of a cheap step, looked at only if needed
        #: Reading a CPU tensor's value costs no device sync, so cheap CPU steps check values at once. False
        #: makes CPU steps take the device path (every layer measured, values read at the flush); tests use it
        #: to exercise that path without a GPU.
        self.host_reads_are_free = True
        self._input: Tensor | None = None
        self._output: Tensor | None = None
        self._never_positive: dict[SlotKey, Tensor] = {}
        self._prev_channel_first = False
        self._backward_seen = False
        self._optimizer_stepped = False
        self._grads_captured = False
        self._snapshot: stats.Snapshot | None = None
        self._loss: Tensor | None = None
        self._last_head_grad: float | None = None
        self._head_param: nn.Parameter | None = None
        self._raw_grads: list[Tensor] | None = None  # norms at the end of backward (fully observed steps)
        self._autocast = False
        self._clip_seen = False
        self._probe_mean = 0.0
        self._probe_count = 0
        self._head_name: str | None = None
        self._warned: set[str] = set()

    # ------------------------------------------------------------------------------------------------
    # failures of the recorder itself become warnings, and recording stops; training goes on untouched

    def _fail(self, where: str, exc: BaseException) -> None:
        self.active = False
        self._in_forward = False
        self._release()
        self._never_positive.clear()
        self._snapshot = None
        if where not in self._warned:
            self._warned.add(where)
            warnings.warn(
                f"NeuralDBG stopped observing this run: {where} failed with {exc!r}. "
                "Training is not affected; the diagnosis covers the steps observed so far.",
                NeuralDbgWarning,
                stacklevel=3,
            )

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, NeuralDbgWarning, stacklevel=3)

    # ------------------------------------------------------------------------------------------------
    # forward pass

    def on_forward_start(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self.active:
            return
        try:
            if not (torch.is_grad_enabled() and module.training):
                self._in_forward = False
                return
            self._close_step_if_done()
            self._in_forward = True
            self._calls.clear()
            self._release()
            self._prev_channel_first = False
            self._order_known = self._order_seen == len(self.order) > 0  # the last forward added no layer
            self._order_seen = len(self.order)
            t = stats.first_tensor(args) if args else None
            if t is None and kwargs:
                t = stats.first_tensor(kwargs)
            self._input = t
            if t is not None:
                self._pending.data.input_numel = t.numel()
                if self._full:  # under autocast a GradScaler may scale gradients between backward and step
                    self._autocast = torch.is_autocast_enabled(t.device.type)
        except Exception as exc:
            self._fail("the forward pre-hook", exc)

    def on_layer_output(self, name: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """A watched layer's forward hook. On a cheap step it only keeps the output (a list append): it is
        looked at only if the step turns out non-finite. On a fully observed step its statistics are computed
        now, before anything downstream can modify the output in place."""
        if not self._in_forward:  # also False once recording stopped
            return
        if not self._full:
            self._seen.append((name, output))
            return
        try:
            t = stats.first_tensor(output)
            if t is None:
                return
            key = self._key(name)
            self._refs[key] = t
            info = self._infos[name]
            self._pending.data.numel[key] = t.numel()
            self._full_layer_stats(key, info, t)
            self._prev_channel_first = info.channel_first or t.dim() >= 4
        except Exception as exc:
            self._fail(f"the forward hook of layer {name!r}", exc)

    def _key(self, name: str) -> SlotKey:
        """(name, call index in this forward pass), recorded in forward order the first time it is seen."""
        call = self._calls.get(name, 0)
        self._calls[name] = call + 1
        key = (name, call)
        if key not in self._order_set:
            self._order_set.add(key)
            self.order.append(key)
        return key

    def _layer_refs(self) -> dict[SlotKey, Tensor]:
        """Every layer output of this forward pass, by key (kept as tensors on full steps, as raw outputs on
        cheap ones)."""
        for name, output in self._seen:
            t = stats.first_tensor(output)
            if t is not None:
                self._refs[self._key(name)] = t
        self._seen.clear()
        return self._refs

    def _full_layer_stats(self, key: SlotKey, info: LayerInfo, t: Tensor) -> None:
        pending = self._pending
        if info.role is Role.GATED:
            cf = self._prev_channel_first or t.dim() >= 4
            dead = stats.dead_units(t, cf, self._config.dead_sample_fraction)
            pending.put("dead", key, dead, stats.unit_count(t, cf))
        elif info.role is Role.BOUNDED and info.bound is not None:
            sat = stats.saturated_count(t, info.bound.center, info.bound.radius)
            pending.put("saturated", key, sat, t.numel())
        elif (
            info.unit_weight is not None and key[1] == 0 and not (self._order_known and self._activated_by_module(key))
        ):
            self._never_positive[key] = stats.never_positive(t, info.channel_first)
        if self._config.output_gradients and t.requires_grad and not _compiling():
            hooks.on_gradient(t, partial(self._on_output_gradient, key))

    def on_forward_end(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not (self.active and self._in_forward):
            return
        self._in_forward = False
        try:
            t = stats.first_tensor(output)
            if t is None:
                return
            self._output = t
            self._pending.data.output_numel = t.numel()
            cheap_cpu = not self._full and t.is_cpu and self.host_reads_are_free
            if cheap_cpu:
                self._check_ends(t)  # check now, and let the activations go
            # the loss gradient w.r.t. the output is read from a tensor hook, which also marks the start of the
            # backward pass; on a cheap CPU step under an optimizer, one element of the head layer's gradient
            # read at the optimizer step stands in for it (a Python call from the autograd engine costs ~15 us)
            if t.requires_grad and not (cheap_cpu and self.mode is StepMode.OPTIMIZER):
                hooks.on_gradient(t, self._on_backward_start)
        except Exception as exc:
            self._fail("the forward hook of the model", exc)

    # ------------------------------------------------------------------------------------------------
    # backward pass

    def _on_backward_start(self, grad: Tensor) -> None:
        if not self.active:
            return
        try:
            if self._output is not None:  # fully observed step, or a GPU step: every layer output, batched
                self._put_all_norms(grad)
            else:  # cheap CPU step, already checked at the end of the forward pass
                value = stats.cpu_norm(grad)
                self._pending.data.target_grad = merge_max(self._pending.data.target_grad, value)
            self._backward_seen = True
            wanted = self.mode is not StepMode.OPTIMIZER or (self._full and self._look_for_clipping())
            if wanted and not hooks.at_backward_end(self._on_backward_end):
                self.warn_once("callback", "NeuralDBG: backward-end callbacks are unavailable")
        except Exception as exc:
            self._fail("the backward hook of the model output", exc)

    def _put_all_norms(self, grad: Tensor) -> None:
        """Every layer output's norm, the input's, the output's and the loss gradient's, as device tensors for
        the next flush (no sync). The references are let go afterwards."""
        refs = self._layer_refs()
        keys = list(refs)
        ends = [(target, t) for target, t in (("input", self._input), ("output", self._output)) if t is not None]
        values = stats.norms([*(refs[k] for k in keys), *(t for _, t in ends), grad])
        pending = self._pending
        for key, value in zip(keys, values):
            pending.put("act", key, value)
        for (target, _), value in zip(ends, values[len(keys) :]):
            pending.put(target, None, value)
        pending.put("target_grad", None, values[-1])
        self._release()

    def _check_ends(self, output: Tensor) -> None:
        """The cheap check of a CPU step, at the end of the forward pass: the norm of the output, read at once (a
        CPU tensor's value costs no device sync). Only when it is non-finite are the input and the layer outputs,
        still alive, measured to find where it started; then they are let go. (On a GPU every layer output is
        measured each step instead: the reductions are cheap there, and values are read only at the flush.)"""
        data = self._pending.data
        value = stats.cpu_norm(output)
        data.output_norm = merge_max(data.output_norm, value)
        if not math.isfinite(value):  # a non-finite input shows in the output: now find where it started
            if self._input is not None:
                data.input_norm = merge_max(data.input_norm, stats.cpu_norm(self._input))
            refs = self._layer_refs()
            if refs:
                for key, norm in zip(refs, stats.to_host(stats.norms(list(refs.values())))):
                    data.act[key] = merge_max(data.act.get(key), norm)
        self._release()

    def _release(self) -> None:
        """Let go of this forward pass's tensors."""
        self._refs.clear()
        self._seen.clear()
        self._input = self._output = None

    def _on_output_gradient(self, key: SlotKey, grad: Tensor) -> None:
        if not self.active:
            return
        try:
            self._pending.put("out_grad", key, stats.norms([grad])[0])
        except Exception as exc:
            self._fail(f"the gradient hook of layer {key[0]!r}", exc)

    def _look_for_clipping(self) -> bool:
        """Whether this fully observed step also reads the gradients before the optimizer sees them: always once
        clipping was seen, otherwise in the first steps and every 16th step (a check costs a pass over every
        gradient, which a run without clipping need not pay on every step of the "full" preset)."""
        return self._clip_seen or self.step < 16 or self.step % 16 == 0

    def _on_backward_end(self) -> None:
        """Under an optimizer, on a fully observed step: the gradient norms as the backward pass left them, to
        compare with what reaches the optimizer (``clip_grad_norm_`` in between hides an explosion). Without an
        optimizer: the step's gradients themselves."""
        if not self.active:
            return
        try:
            if self.mode is StepMode.OPTIMIZER:
                grads = [p.grad for _, p in self._params if p.grad is not None]
                self._raw_grads = stats.norms(grads) if grads and not self._autocast else None
            else:
                self._capture_gradients()
        except Exception as exc:
            self._fail("the end of the backward pass", exc)

    # ------------------------------------------------------------------------------------------------
    # optimizer

    def _owned_by(self, optimizer: torch.optim.Optimizer) -> frozenset[str]:
        """Names of the watched model's parameters that ``optimizer`` owns (cached until its groups change)."""
        groups = optimizer.param_groups
        if optimizer is self._last_optimizer and len(groups) == 1 and len(groups[0]["params"]) == self._last_size:
            return self._last_owned
        size = sum(len(g["params"]) for g in groups) if len(groups) > 1 else len(groups[0]["params"])
        cached = self._owned.get(id(optimizer))
        if cached is not None and cached[1] == size and cached[0]() is optimizer:
            return cached[2]
        ours = {id(p): n for n, p in self._params}
        owned = frozenset(ours[id(p)] for g in groups for p in g["params"] if id(p) in ours)
        self._owned[id(optimizer)] = (weakref.ref(optimizer), size, owned)
        self._last_optimizer, self._last_size, self._last_owned = optimizer, size, owned
        return owned

    def on_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.active:
            return
        try:
            if not self._owned_by(optimizer):
                return
            if self.mode is StepMode.UNKNOWN:
                self._fold_provisional(StepMode.OPTIMIZER)
            self._optimizer_stepped = True
            data = self._pending.data
            lrs = [g.get("lr", 0.0) for g in optimizer.param_groups]
            seen = self._lr_seen.get(id(optimizer))
            if seen is not None and seen != lrs:
                data.lr_changed = True
                self._schedule.trigger(self.step + 1)
                if not self._grads_captured:
                    data.full = self._full = True  # measure this step's update, the first with the new lr
            self._lr_seen[id(optimizer)] = lrs
            if not self._grads_captured:
                self._capture_gradients()
            self._backward_seen = True
            if not data.full:
                self._read_head_gradient()
            else:
                names = {id(p): n for n, p in self._params}
                stepped = self._pending.data.stepped
                for group in optimizer.param_groups:
                    lr = float(group.get("lr", 0.0))
                    for p in group["params"]:
                        name = names.get(id(p))
                        if name is not None:
                            stepped[name] = max(lr, stepped.get(name, 0.0))
        except Exception as exc:
            self._fail("the optimizer step hook", exc)

    def _head(self) -> nn.Parameter | None:
        """The parameter whose gradient stands for the loss's reach: the last parametric layer's weight (or
        its smallest parameter when the weight is huge, like a language-model head)."""
        if self._head_param is None and self.order:
            for layer, _ in reversed(self.order):
                names = [n for n in self._infos[layer].params if n in self._by_name]
                if names:
                    params = sorted((self._by_name[n] for n in names), key=lambda p: p.numel())
                    weight = self._by_name.get(self._infos[layer].unit_weight or "")
                    self._head_param = weight if weight is not None and weight.numel() <= 1 << 20 else params[0]
                    self._head_name = next(n for n in names if self._by_name[n] is self._head_param)
                    break
        return self._head_param

    def _read_head_gradient(self) -> None:
        """A cheap step's only look at the loss: the first element of the head layer's gradient. A non-finite
        loss (a mean over the batch) makes every element of it non-finite, so one element tells; reading it
        straight from memory costs a fraction of a microsecond, where any tensor operation costs several."""
        head = self._head_param if self._head_param is not None else self._head()
        grad = head.grad if head is not None else None
        if grad is None or not grad.is_cpu or not self.host_reads_are_free or grad.numel() == 0:
            return
        if grad.dtype is torch.float32:
            value = ctypes.c_float.from_address(grad.data_ptr()).value
        else:
            value = float(grad.reshape(-1)[0])
        self._pending.data.head_finite = math.isfinite(value)
        # an outlier batch shows as a jump of this element against its running mean: observe what follows
        magnitude = abs(value)
        if self._probe_count >= 8 and magnitude > 20 * self._probe_mean + 1e-12:
            self._schedule.trigger(self.step + 1)
        if math.isfinite(magnitude):
            self._probe_mean += (magnitude - self._probe_mean) / min(self._probe_count + 1, 16)
            self._probe_count += 1

    # ------------------------------------------------------------------------------------------------
    # gradients and updates (fully observed steps)

    def _capture_gradients(self) -> None:
        self._grads_captured = True
        pending = self._pending
        if not pending.data.full:
            return
        with_grad = [(n, p, p.grad) for n, p in self._params if p.grad is not None]
        if not with_grad:
            return
        grads = [g for _, _, g in with_grad]
        raw, self._raw_grads = self._raw_grads or [], None
        values = stats.to_host([*stats.norms(grads), *raw])
        values, raw_values = values[: len(grads)], values[len(grads) :]
        data = pending.data
        data.grad_clip_factor = _clip_factor(values, raw_values)
        self._clip_seen |= data.grad_clip_factor is not None
        for (name, _, g), value in zip(with_grad, values):
            data.grad_numel[name] = g.numel()
            if value == 0.0 or not math.isfinite(value):
                exact_zero, finite = stats.exact_zero_and_finite(g)
                if exact_zero:
                    data.grad_exact_zero.add(name)
                elif value == 0.0:
                    value = float(g.detach().abs().max())  # underflow: the largest element bounds the norm
                if not finite:
                    data.grad_nonfinite.add(name)
            data.grad[name] = value
        if self._head() is not None:
            data.head_grad = data.grad.get(self._head_name or "")
        by_param = {n: g for n, _, g in with_grad}
        for key, never in self._never_positive.items():
            weight = self._infos[key[0]].unit_weight
            unit_grad = by_param.get(weight) if weight else None
            if self._activated_by_module(key):
                continue  # the activation module's own per-unit statistics cover it
            if unit_grad is not None and unit_grad.dim() >= 1 and unit_grad.shape[0] == never.shape[0]:
                both = (never & stats.zero_gradient_units(unit_grad)).sum(dtype=torch.float32)
                pending.put("func_dead", key, both, int(never.shape[0]))
        self._never_positive.clear()
        if self._config.track_updates and self._snapshot is None:
            self._snapshot = stats.Snapshot([n for n, _, _ in with_grad], [p for _, p, _ in with_grad])

    def _activated_by_module(self, key: SlotKey) -> bool:
        """Whether the layer's per-unit statistics are covered elsewhere: the next layer output in forward order
        is a ReLU-family or bounded activation module, or no parametric layer follows (the model's output
        layer: its units feed the loss, not a ReLU)."""
        if len(self._next_role) != len(self.order):
            roles = [self._infos[name].role for name, _ in self.order]
            last = max((i for i, r in enumerate(roles) if r is Role.PARAMETRIC), default=-1)
            self._next_role = {
                key: (roles[i + 1] if i + 1 < len(roles) and i < last else Role.GATED)
                for i, key in enumerate(self.order)
            }
        return self._next_role.get(key) in (Role.GATED, Role.BOUNDED)

    def _measure_updates(self) -> None:
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is None:
            return
        deltas, after, before = snapshot.changes()
        for name, scale, delta, weight, old in zip(snapshot.names, snapshot.scales, deltas, after, before):
            self._pending.put("delta", name, delta, scale)
            self._pending.put("weight", name, weight)
            self._pending.put("before", name, old)

    # ------------------------------------------------------------------------------------------------
    # step boundaries

    def manual_step(self) -> None:
        """``dbg.step()``: close the current step now; from here on only ``step()`` closes steps."""
        if not self.active:
            return
        if self.mode is not StepMode.MANUAL:
            self._fold_provisional(StepMode.MANUAL)
        if not self._grads_captured:
            self._capture_gradients()
        self._commit()

    def observe_loss(self, loss: Tensor) -> None:
        if self.active:
            self._loss = loss.detach()

    def _close_step_if_done(self) -> None:
        if self.mode is StepMode.OPTIMIZER:
            if self._optimizer_stepped:
                self._commit()
        elif self.mode is not StepMode.MANUAL and self._backward_seen:
            if self.mode is StepMode.UNKNOWN:
                self._provisional += 1
                if self._provisional >= _PROVISIONAL_LIMIT:
                    self.mode = StepMode.BACKWARD
            self._commit()

    def _fold_provisional(self, mode: StepMode) -> None:
        """An optimizer (or ``step()``) appeared: earlier backward passes were micro-batches of one step."""
        self.mode = mode
        if not self._provisional:
            return
        first = self._buffer[0].data.step if self._buffer else self._pending.data.step
        merged = Pending(first, self._buffer[0].data.full if self._buffer else self._pending.data.full)
        for part in [*self._buffer, self._pending]:
            merged.tensors.extend(part.tensors)
            merged.targets.extend(part.targets)
            merged.data.numel.update(part.data.numel)
            merged.data.input_numel = part.data.input_numel or merged.data.input_numel
            merged.data.output_numel = part.data.output_numel or merged.data.output_numel
        # keep host-side gradient readings of the latest micro-batch
        last = self._pending.data
        for attr in ("grad", "grad_numel", "grad_exact_zero", "grad_nonfinite", "stepped"):
            setattr(merged.data, attr, getattr(last, attr))
        self._buffer.clear()
        self._pending = merged
        self._full = merged.data.full
        self.step = first
        self._provisional = 0

    def _commit(self) -> None:
        self._measure_updates()
        if self._loss is not None:
            loss = self._loss
            self._pending.put("loss", None, loss if loss.dim() == 0 else loss.float().mean())
            self._loss = None
        finished = self._pending
        self._buffer.append(finished)
        self.step += 1
        self._pending = Pending(self.step, self._schedule.is_full(self.step))
        self._full = self._pending.data.full
        self._backward_seen = False
        self._optimizer_stepped = False
        self._grads_captured = False
        self._raw_grads = None
        self._never_positive.clear()
        if self.mode is StepMode.UNKNOWN:
            return  # held until we know whether these are steps or micro-batches
        if finished.data.full or len(self._buffer) >= _BUFFER_LIMIT:
            self.flush()

    def flush(self) -> None:
        """Move every committed step to the host in one transfer and hand them to the sink."""
        if not self._buffer:
            return
        buffer, self._buffer = self._buffer, []
        values = stats.to_host(t for p in buffer for t in p.tensors)
        i = 0
        for part in buffer:
            for (target, key, extra), value in zip(part.targets, values[i : i + len(part.tensors)]):
                assign(part.data, target, key, extra, value)
            i += len(part.tensors)
        records = [p.data for p in buffer]
        suspicious = False
        for record in records:
            suspicious |= _suspicious(record, self._config, self._last_head_grad)
            if record.head_grad is not None and math.isfinite(record.head_grad):
                self._last_head_grad = record.head_grad
        if self._sink(records) or suspicious:  # the sink says a new abnormal state began
            self._schedule.trigger(self.step)

    def finish(self) -> None:
        """Close the step in progress (if anything was observed in it) and flush everything."""
        if self.active:
            try:
                if self._backward_seen or self._optimizer_stepped or self._pending.tensors:
                    if self.mode is StepMode.UNKNOWN:
                        self.mode = StepMode.BACKWARD
                    self._commit()
                elif self.mode is StepMode.UNKNOWN and self._buffer:
                    self.mode = StepMode.BACKWARD
                self.flush()
            except Exception as exc:
                self._fail("the final flush", exc)
        self._release()
        self._never_positive.clear()
        self._snapshot = None
        self._loss = None
        self._last_optimizer = None


def _suspicious(record: StepData, config: DebugConfig, previous_head_grad: float | None) -> bool:
    """Signals that warrant full observation of the next steps: a learning-rate change, a non-finite or
    blown-up output, a head-layer gradient ten times larger than at the previous step (an outlier batch)."""
    if record.lr_changed:
        return True
    hg = record.head_grad
    if hg is not None and previous_head_grad and (not math.isfinite(hg) or hg > 10 * previous_head_grad):
        return True
    for key, norm in record.act.items():
        if not math.isfinite(norm):
            return True
        n = record.numel.get(key, 0)
        if n and norm / math.sqrt(n) > config.anomalous_rms:
            return True
    return record.loss is not None and not math.isfinite(record.loss)


def _clip_factor(at_step: list[float], after_backward: list[float]) -> float | None:
    """How much smaller the gradients reached the optimizer than the backward pass left them (clipping), or None.

    A ratio that is an exact power of two is a loss scale being removed, not clipping (runs under autocast are
    not compared at all, since a GradScaler's scale changes from step to step)."""
    if not after_backward or len(after_backward) != len(at_step):
        return None
    final = math.sqrt(sum(v * v for v in at_step))
    raw = math.sqrt(sum(v * v for v in after_backward))
    if not (math.isfinite(final) and math.isfinite(raw)) or final <= 0 or raw <= final * 1.01:
        return None
    exponent = math.log2(raw / final)
    return None if abs(exponent - round(exponent)) < 1e-4 else raw / final


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    return bool(check()) if check is not None else False
