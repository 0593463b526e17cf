"""The backward pass and the optimizer step: when gradients are read, and where a step ends."""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from ..model.shards import Param
from ..stats import tensors as stats
from ..stats.step import SlotKey
from . import collector, hooks, measure
from .clock import StepMode
from .gradients import GradientReader
from .pending import merge_max

if TYPE_CHECKING:
    from .forward import ForwardPath
    from .recorder import Recorder


def _closure(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``optimizer.step`` was given a closure (its forward and backward passes run inside the step). The
    step hooks receive the step's arguments with the optimizer itself first."""
    closure = args[1] if len(args) > 1 else kwargs.get("closure")
    return callable(closure)


class BackwardPath:
    """The model output's gradient hook, the end-of-backward callback and the optimizer step hooks."""

    def __init__(self, rec: Recorder, model: nn.Module, forward: ForwardPath) -> None:
        self._rec = weakref.proxy(rec)  # the recorder owns this part (see Recorder.__init__)
        self._fwd = forward
        self.grads = GradientReader(rec, model, forward)
        self._owned: dict[int, tuple[weakref.ref[Optimizer], int, frozenset[str]]] = {}
        self._last: tuple[Optimizer | None, int, frozenset[str]] = (None, -1, frozenset())
        self._lr_seen: dict[int, list[Any]] = {}  # optimizer id -> its groups' learning rates at the last step
        self._met: set[int] = set()  # optimizers whose first observed step was looked at (see _resumed)
        self._fresh: weakref.ref[Optimizer] | None = None  # the optimizer stepping now, had it no state before
        self._names: dict[int, list[str]] | None = None  # see tensor_names

    @property
    def params(self) -> list[Param]:
        return self.grads.params

    def forget_owners(self) -> None:
        """The parameters followed changed (one was unfrozen): which of them each optimizer holds is asked again."""
        self._owned = {}
        self._last = (None, -1, frozenset())
        self._names = None
        self._rec.ledger.forget_decay()

    def detach(self) -> None:
        self.grads.drop()
        self._last = (None, -1, frozenset())

    # --- the backward pass --------------------------------------------------------------------------------

    @collector.paused
    def on_backward_start(self, grad: Tensor) -> None:
        """The gradient of the loss w.r.t. the model's output arrived: the backward pass began."""
        rec = self._rec
        if not _live(rec):
            return
        try:
            fwd = self._fwd
            fwd.close()
            fwd.confirm()
            scale = rec.scaler.tensor()  # a GradScaler's scale in this backward pass: divided out of its gradients
            if fwd.output is not None:  # fully observed step, or a GPU step: every layer output, batched
                ends = [(target, t) for target, t in (("input", fwd.input), ("output", fwd.output)) if t is not None]
                ends = [(target, t) for target, t in ends if t.is_floating_point()]
                measure.all_norms(rec.pending, fwd.layer_refs(), ends, grad, scale)
                if fwd.others:
                    rec.pending.put("arguments_nan", None, stats.nan_flag(fwd.others))
                if rec.pending.data.full and fwd.output is not None:
                    measure.output_dead_pulled(rec.pending, fwd.output, grad)
                fwd.release()
            else:  # cheap CPU step, already checked at the end of the forward pass
                data = rec.pending.data
                norm = stats.host_norm(grad)
                if norm is not None:
                    value = norm / float(scale) if scale is not None else norm
                    data.target_grad = merge_max(data.target_grad, value)
            rec.clock.backward_begins()
            wanted = rec.clock.mode is not StepMode.OPTIMIZER or (rec.pending.data.full and self._look_for_clipping())
            if wanted and not hooks.at_backward_end(self._on_backward_end):
                rec.warn_once("callback", "NeuralDBG: backward-end callbacks are unavailable")
        except Exception as exc:
            rec.fail("the backward hook of the model output", exc)

    def on_output_gradient(self, key: SlotKey, grad: Tensor) -> None:
        if _live(self._rec):
            try:
                norm = stats.norms([grad])[0]
                scale = self._rec.scaler.tensor()
                self._rec.pending.put("out_grad", key, norm / scale if scale is not None else norm)
            except Exception as exc:
                self._rec.fail(f"the gradient hook of layer {key[0]!r}", exc)

    def _look_for_clipping(self) -> bool:
        """Whether this fully observed step also reads the gradients before the optimizer sees them: always once
        clipping was seen, otherwise in the first steps and every 16th step (a pass over every gradient)."""
        step = self._rec.clock.step
        return self.grads.clip_seen or step < 16 or step % 16 == 0

    @collector.paused
    def _on_backward_end(self) -> None:
        """The gradients as the backward pass left them: compared with what reaches the optimizer (clipping in
        between hides an explosion), and, until an optimizer is known to step, the step's gradients."""
        rec = self._rec
        if not rec.active:
            return
        try:
            scale = rec.scaler.tensor()  # a GradScaler's scale, still in the gradients until scaler.step()
            if not rec.pending.data.full:
                self.grads.read_head(float(scale) if scale is not None else 1.0)
                return
            raw = self.grads.raw_norms(scale)
            if rec.clock.mode is not StepMode.OPTIMIZER:
                # no optimizer (yet): read them now, the next zero_grad() may come before any optimizer step; an
                # optimizer step that does come reads them again (after clipping), with these as the raw norms
                self.grads.capture(float(scale) if scale is not None else 1.0)
            self.grads.raw = raw
        except Exception as exc:
            rec.fail("the end of the backward pass", exc)

    # --- the optimizer step -------------------------------------------------------------------------------

    @collector.paused
    def on_optimizer_step(self, optimizer: Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Before an optimizer's step (global pre-hook)."""
        rec = self._rec
        if not rec.active:
            return
        try:
            owned = self._owned_by(optimizer)
            if not owned:
                rec.coverage.foreign_optimizer_steps += 1
                return
            if rec.scaler.scaler is None and rec.scaler.discover():
                rec.adopt_scaler()
            self._fresh = None if optimizer.state else weakref.ref(optimizer)
            if id(optimizer) not in self._lr_seen and rec.clock.optimizer_steps == 0 and optimizer.state:
                rec.pending.data.warm_start = True  # it stepped before the debugger was attached
            self._fwd.close()
            self._fwd.compiled.pull()
            closure = _closure(args, kwargs)
            if rec.clock.optimizer_begins(closure):
                rec.fold()
            if id(optimizer) not in self._met:
                self._met.add(id(optimizer))
                if _trained_before(optimizer):
                    rec.pending.data.resumed = True
            self._learning_rates(optimizer)
            if not closure:
                rec.ledger.before_step(optimizer, owned)
                self._gradients_final(optimizer)
            elif rec.config.track_updates and rec.schedule.is_full(rec.clock.next_index()):
                # the forward and backward passes may still be to come, inside the step: measure the update across
                # the whole step, from every trainable parameter as it is now (the step in progress, if complete,
                # is committed when the closure's forward begins)
                self.grads.hold_snapshot(self.params)
        except Exception as exc:
            rec.fail("the optimizer step hook", exc)

    @collector.paused
    def on_optimizer_stepped(self, optimizer: Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """After an optimizer's step (global post-hook): a closure step is complete, its gradients final."""
        rec = self._rec
        if not rec.active:
            return
        try:
            owned = self._owned_by(optimizer)
            if not owned:
                return
            if rec.clock.in_closure and rec.clock.optimizer_ends():
                self._fwd.close()
                self.grads.adopt_snapshot()  # a closure that ran no forward pass: an ordinary step
                rec.ledger.before_step(optimizer, owned)
                self._gradients_final(optimizer)
            rec.ledger.after_step(owned)
            fresh, self._fresh = self._fresh, None
            if fresh is not None and fresh() is optimizer:
                self._note_reset(optimizer)
        except Exception as exc:
            rec.fail("the optimizer step hook", exc)

    def _note_reset(self, optimizer: Optimizer) -> None:
        """An optimizer with no state before its step: count the step when the state it leaves holds something
        carried from step to step (a momentum buffer, moment estimates: tensors with elements, not a step count).
        An optimizer that keeps none (SGD without momentum) starts over harmlessly."""
        state = next(iter(optimizer.state.values()), None)
        if not isinstance(state, dict):
            return
        kept = sorted(str(k) for k, v in state.items() if isinstance(v, Tensor) and v.dim() > 0)
        if not kept:
            return
        coverage, clock = self._rec.coverage, self._rec.clock
        coverage.reset_steps += 1
        if coverage.first_reset < 0 and clock.optimizer_steps > 1:  # the run's first step starts from nothing
            coverage.first_reset = clock.step
        groups = optimizer.param_groups
        momentum = groups[0].get("momentum") if groups else None
        coverage.reset_optimizer = type(optimizer).__name__
        coverage.reset_state = tuple(kept)
        coverage.reset_momentum = float(momentum) if isinstance(momentum, (int, float)) else math.nan

    def _learning_rates(self, optimizer: Optimizer) -> None:
        rec = self._rec
        data = rec.pending.data
        lrs = [g.get("lr", 0.0) for g in optimizer.param_groups]
        seen = self._lr_seen.get(id(optimizer))
        if seen is not None and seen != lrs:
            data.lr_changed = True
            rec.schedule.trigger(rec.clock.step + 1)
            if not self.grads.captured:
                data.full = True  # measure this step's update, the first with the new learning rate
        self._lr_seen[id(optimizer)] = lrs

    def _gradients_final(self, optimizer: Optimizer) -> None:
        data = self._rec.pending.data
        data.optimizers.add(id(optimizer))
        self.grads.once(self._fused_scaling(optimizer))
        if data.full:
            names = self.tensor_names()
            for group in optimizer.param_groups:
                lr = float(group.get("lr", 0.0))
                for t in group["params"]:
                    if not t.requires_grad and t.grad is None:
                        continue  # frozen since the debugger was made: the optimizer skips it (no gradient)
                    for name in names.get(id(t), ()):
                        data.stepped[name] = max(lr, data.stepped.get(name, 0.0))
            _note_settings(optimizer, data.settings)

    def _fused_scaling(self, optimizer: Optimizer) -> float:
        """A GradScaler stepping an optimizer that unscales inside its own kernel (``fused=True``) calls its step
        with the gradients still scaled, the scale in ``optimizer.grad_scale`` and ``optimizer.found_inf`` set when
        the kernel is to skip the update: that step is a skipped step. Returns the scale still in the gradients
        (1.0 for every other optimizer). Reads ``found_inf`` (a device read on a GPU, once per such step)."""
        found = getattr(optimizer, "found_inf", None)
        if not isinstance(found, Tensor):
            return 1.0
        if float(found) > 0:
            self._rec.clock.skipped_in_step()
        scale = getattr(optimizer, "grad_scale", None)
        return float(scale) if isinstance(scale, Tensor) else 1.0

    def tensor_names(self) -> dict[int, list[str]]:
        """The names of the followed parameters by the id of the tensor that holds them (a flat FSDP1 parameter
        holds several of the user's), kept until the parameters followed change (:meth:`forget_owners`)."""
        names = self._names
        if names is None:
            names = self._names = {}
            for p in self.params:
                names.setdefault(id(p.tensor), []).append(p.name)
        return names

    def _owned_by(self, optimizer: Optimizer) -> frozenset[str]:
        """Names of the watched model's parameters that ``optimizer`` owns (cached until its groups change)."""
        groups = optimizer.param_groups
        last, size, owned = self._last
        if optimizer is last and len(groups) == 1 and len(groups[0]["params"]) == size:
            return owned
        size = sum(len(g["params"]) for g in groups)
        cached = self._owned.get(id(optimizer))
        if cached is not None and cached[1] == size and cached[0]() is optimizer:
            owned = cached[2]
        else:
            ours = self.tensor_names()
            owned = frozenset(name for g in groups for t in g["params"] for name in ours.get(id(t), ()))
            self._owned[id(optimizer)] = (weakref.ref(optimizer), size, owned)
        self._last = (optimizer, size, owned)
        return owned


#: Optimizers whose ``eps`` is added to the root of their second moment (a third-party Adam holds ``betas`` too).
_ADAPTIVE = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.Adamax,
    torch.optim.Adagrad,
    torch.optim.RMSprop,
)


def _note_settings(optimizer: Optimizer, settings: dict[str, float]) -> None:
    """The settings besides the learning rate that size the steps (host reads of ``param_groups``, on fully observed
    steps only), into ``settings``: the largest ``eps`` of an adaptive optimizer's groups holding parameters, and the
    largest ``momentum`` of the groups that do not dampen it (SGD's default). Several optimizers in one step: the
    largest. See :mod:`neuraldbg.kinds.optimizer_settings`."""
    adaptive = isinstance(optimizer, _ADAPTIVE)
    for group in optimizer.param_groups:
        if not group["params"]:
            continue
        eps, momentum = group.get("eps"), group.get("momentum")
        if (adaptive or "betas" in group) and isinstance(eps, (int, float)):
            settings["eps"] = max(float(eps), settings.get("eps", 0.0))
        if isinstance(momentum, (int, float)) and momentum > 0 and not group.get("dampening"):
            settings["momentum"] = max(float(momentum), settings.get("momentum", 0.0))


def _trained_before(optimizer: Optimizer) -> bool:
    """The optimizer already holds state for a parameter at its first observed step (Adam's moments, SGD's momentum
    buffer): the run trained before the debugger attached (a resumed run, a fine-tuning script), so the first
    observed step is not the start of its history."""
    state = optimizer.state
    return any(state.get(p) for group in optimizer.param_groups for p in group["params"])


def _live(rec: Recorder) -> bool:
    """Whether the recorder observes now. A tensor's gradient hook outlives the debugger that put it there (a
    debugger closed and dropped between a forward pass and its backward pass): then it does nothing."""
    try:
        return rec.active
    except ReferenceError:
        return False
