"""The capture path: what each hook records.

Hooks (registered by :mod:`neuraldbg.hooks`): one global module forward hook, called for every module call in the
process (the watched model's modules are recognised by identity, so nothing is stored on the modules and a model
can be pickled, saved or deep-copied mid-run), the global optimizer step pre- and post-hooks, a tensor hook on the
model's output (the loss gradient; it also marks the start of the backward pass) and an end-of-backward callback.

Which forwards count. Records come only from the thread that attached the debugger and from forwards with
gradients enabled: a ``no_grad`` / ``inference_mode`` forward, or another thread serving predictions, never enters
a step's statistics. A forward pass *opens* at the first call of a watched module and closes when the model's own
forward returns (or when the backward pass or the optimizer step begins, for code that calls submodules directly).
A forward with the model in eval mode is training only if a backward pass follows: its records are staged and
kept when its output's gradient arrives, and dropped otherwise (a validation pass without ``no_grad``).

Cheap and full steps. On a cheap step a layer's output is only kept (a list append) and looked at if the step
turns out non-finite. On a fully observed step (see :mod:`neuraldbg.schedule`) the statistics of
:mod:`neuraldbg.measure` are computed in the layer's hook, before anything downstream can modify the output in
place.

torch.compile. Inside a compiled graph the hooks do tensor work only: each layer's statistics are packed into a
slot of a dictionary whose keys are fixed when the debugger attaches, so Dynamo traces them without a graph break
and without recompiling; the slots are read at the optimizer step, outside the graph.
"""

from __future__ import annotations

import math
import threading
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from . import hooks, measure, stats
from .clock import StepMode
from .layers import LayerInfo, Role
from .stepdata import Pending, SlotKey, merge_max

if TYPE_CHECKING:
    from .recorder import Recorder

_TICK = "\x00tick"  # a compiled slot rewritten by every compiled hook: changes whenever a compiled forward ran
_INPUT = "\x00input"


def _compiling() -> bool:
    return bool(torch.compiler.is_compiling())


class ForwardPath:
    """The forward hook: layer outputs and the model's output. See the module docstring."""

    def __init__(self, rec: Recorder, model: nn.Module, infos: dict[str, LayerInfo], order: list[SlotKey]) -> None:
        self._rec = rec
        self._infos = infos
        self._config = rec.config
        self._model = weakref.ref(model)
        self._specs = {name: measure.spec_of(info) for name, info in infos.items()}
        self._names: dict[nn.Module, str] = {}
        self._root: nn.Module | None = None
        self._thread = 0
        self.order = order  # forward order of layer outputs, shared with the analysis
        self._order_set: set[SlotKey] = set(order)
        self._order_seen = 0
        self._order_known = False  # the forward order is complete (what comes after a layer is known)
        self._next_role: dict[SlotKey, Role] = {}
        self._open = False
        self._full = False
        self._tentative: Pending | None = None  # records of an eval-mode forward, kept if a backward follows
        self._calls: dict[str, int] = {}
        self.refs: dict[SlotKey, Tensor] = {}  # layer outputs of a fully observed step
        self._seen: list[tuple[str, Any]] = []  # raw layer outputs of a cheap step, looked at only if needed
        self.input: Tensor | None = None
        self.output: Tensor | None = None
        self.never_positive: dict[SlotKey, Tensor] = {}
        self._prev_channel_first = False
        self.autocast = False
        self.host_reads_are_free = True
        self._slots: dict[str, Tensor] = {}
        self._pulled: dict[str, Tensor] = {}

    def attach(self) -> None:
        model = self._model()
        if model is None:
            raise RuntimeError("the model was garbage-collected")
        self._root = model
        self._names = {module: name for name, module in model.named_modules() if name in self._infos}
        self._thread = threading.get_ident()
        empty = torch.zeros(0)
        self._slots = {name: empty for name in [*self._infos, _TICK, _INPUT]}
        self._pulled = dict(self._slots)

    def detach(self) -> None:
        self._names = {}
        self._root = None
        self.release()

    # --- the hook ---------------------------------------------------------------------------------------

    def on_module_output(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if _compiling():
            self._compiled(module, args, output)
            return
        name = self._names.get(module)
        if name is None:
            return
        rec = self._rec
        if threading.get_ident() != self._thread:
            rec.coverage.other_thread_forwards += not name
            return
        if not torch.is_grad_enabled():
            rec.coverage.no_grad_forwards += not name
            return
        if not rec.active:
            return
        try:
            if not self._open:
                self._begin()
            if not name:
                self._end(args, kwargs, output)
            elif not self._full:
                self._seen.append((name, output))
            else:
                self._layer(name, output)
        except Exception as exc:
            rec.fail(f"the forward hook of {repr(name) if name else 'the model'}", exc)

    # --- a forward pass -----------------------------------------------------------------------------------

    def _begin(self) -> None:
        rec = self._rec
        self.discard_tentative()
        if rec.clock.forward_begins():
            rec.commit()
        self._open = True
        self._calls.clear()
        self.release()
        self._prev_channel_first = False
        self._order_known = self._order_seen == len(self.order) > 0  # the last forward added no layer
        self._order_seen = len(self.order)
        self._full = rec.pending.data.full
        rec.coverage.forwards += 1
        if self._root is not None and not self._root.training:  # eval mode: training only if a backward follows
            self._tentative = Pending(rec.pending.data.step, self._full)

    def _target(self) -> Pending:
        return self._tentative if self._tentative is not None else self._rec.pending

    def _layer(self, name: str, output: Any) -> None:
        t = stats.first_tensor(output)
        if t is None:
            return
        key = self._key(name)
        self.refs[key] = t
        target = self._target()
        target.data.numel[key] = t.numel()
        spec = self._specs[name]
        channel_first = (
            spec.channel_first or t.dim() >= 4 or (spec.role is not Role.PARAMETRIC and self._prev_channel_first)
        )
        measure.layer_output(target, key, spec, t, channel_first, self._config)
        if spec.unit_layer and key[1] == 0 and not (self._order_known and self.activated_by_module(key)):
            self.never_positive[key] = stats.never_positive(t, spec.channel_first)
        if self._config.output_gradients and t.requires_grad:
            hooks.on_gradient(t, partial(self._rec.backward.on_output_gradient, key))
        self._prev_channel_first = spec.channel_first or t.dim() >= 4

    def _end(self, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """The model's own forward returned: check a cheap CPU step's output now, and hook its gradient."""
        self._open = False
        t = stats.first_tensor(output)
        if t is None:
            self.discard_tentative()
            return
        inp = stats.first_tensor(args) if args else None
        if inp is None and kwargs:
            inp = stats.first_tensor(kwargs)
        self.input, self.output = inp, t
        data = self._target().data
        data.input_numel = inp.numel() if inp is not None else data.input_numel
        data.output_numel = t.numel()
        if self._full:  # under autocast a GradScaler may scale gradients between backward and step
            self.autocast = torch.is_autocast_enabled(t.device.type)
        cheap_cpu = not self._full and t.is_cpu and self.host_reads_are_free
        if cheap_cpu:
            self._check_ends(t)
        # the loss gradient w.r.t. the output is read from a tensor hook, which also marks the start of the
        # backward pass; on a cheap CPU step under an optimizer, one element of the head layer's gradient read at
        # the optimizer step stands in for it (a Python call from the autograd engine costs ~15 us)
        wanted = self._tentative is not None or not (cheap_cpu and self._rec.clock.mode is StepMode.OPTIMIZER)
        if t.requires_grad and wanted:
            hooks.on_gradient(t, self._rec.backward.on_backward_start)
        elif self._tentative is not None:
            self.discard_tentative()  # an eval-mode output nothing can differentiate: not training

    def _check_ends(self, output: Tensor) -> None:
        """The cheap check of a CPU step: the output's norm, read at once (a CPU read costs no device sync). Only
        when it is non-finite are the input and the layer outputs, still alive, measured to find where it started;
        then they are let go. (On a GPU every layer output is measured each step instead, read at the flush.)"""
        data = self._target().data
        value = stats.host_norm(output)
        data.output_norm = merge_max(data.output_norm, value)
        if not math.isfinite(value):
            if self.input is not None and self.input.is_floating_point():
                data.input_norm = merge_max(data.input_norm, stats.host_norm(self.input))
            refs = self.layer_refs()
            if refs:
                for key, norm in zip(refs, stats.to_host(stats.norms(list(refs.values())))):
                    data.act[key] = merge_max(data.act.get(key), norm)
        self.release()

    def close(self) -> None:
        """The backward pass or the optimizer step began: a forward still open (submodules called directly) ends."""
        self._open = False

    def _key(self, name: str) -> SlotKey:
        """(name, call index in this forward pass), recorded in forward order the first time it is seen."""
        call = self._calls.get(name, 0)
        self._calls[name] = call + 1
        key = (name, call)
        if key not in self._order_set:
            self._order_set.add(key)
            self.order.append(key)
        return key

    def layer_refs(self) -> dict[SlotKey, Tensor]:
        """Every layer output of this forward pass (tensors on full steps, raw outputs on cheap ones)."""
        for name, output in self._seen:
            t = stats.first_tensor(output)
            if t is not None:
                self.refs[self._key(name)] = t
        self._seen.clear()
        return self.refs

    def release(self) -> None:
        """Let go of this forward pass's tensors."""
        self.refs.clear()
        self._seen.clear()
        self.input = self.output = None

    def next_step(self) -> None:
        self.never_positive.clear()

    def activated_by_module(self, key: SlotKey) -> bool:
        """Whether the layer's per-unit statistics are covered elsewhere: the next layer output in forward order
        is a ReLU-family or bounded activation module, or no parametric layer follows (the model's output layer)."""
        if len(self._next_role) != len(self.order):
            roles = [self._infos[name].role for name, _ in self.order]
            last = max((i for i, r in enumerate(roles) if r is Role.PARAMETRIC), default=-1)
            self._next_role = {
                key: (roles[i + 1] if i + 1 < len(roles) and i < last else Role.GATED)
                for i, key in enumerate(self.order)
            }
        return self._next_role.get(key) in (Role.GATED, Role.BOUNDED)

    # --- eval-mode forwards ----------------------------------------------------------------------------

    def confirm(self) -> None:
        """A backward pass follows an eval-mode forward: it is a training step run in eval mode. Keep its records."""
        staged, self._tentative = self._tentative, None
        if staged is None:
            return
        pending = self._rec.pending
        pending.tensors.extend(staged.tensors)
        pending.targets.extend(staged.targets)
        src, dst = staged.data, pending.data
        dst.numel.update(src.numel)
        dst.input_numel = src.input_numel or dst.input_numel
        dst.output_numel = src.output_numel or dst.output_numel
        if src.output_norm is not None:
            dst.output_norm = merge_max(dst.output_norm, src.output_norm)
        if src.input_norm is not None:
            dst.input_norm = merge_max(dst.input_norm, src.input_norm)
        for key, value in src.act.items():
            dst.act[key] = merge_max(dst.act.get(key), value)
        steps = self._rec.coverage.eval_steps
        if not steps or steps[-1] != dst.step:
            steps.append(dst.step)

    def discard_tentative(self) -> None:
        """An eval-mode forward that no backward pass followed: a validation pass, not training."""
        if self._tentative is not None:
            self._tentative = None
            self._rec.coverage.eval_forwards += 1
            self.never_positive.clear()
            self.release()

    # --- compiled graphs ----------------------------------------------------------------------------------

    def _compiled(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """Inside a torch.compile graph: tensor work into fixed slots, nothing else (see the module docstring)."""
        name = self._names.get(module)
        if name is None or not torch.is_grad_enabled():
            return
        t = stats.first_tensor(output)
        if t is None:
            return
        packed = measure.compiled_layer_output(self._specs[name], t, self._config)
        self._slots[name] = packed
        self._slots[_TICK] = packed
        if not name:
            inp = stats.first_tensor(args) if args else None
            if inp is not None:
                norm = torch.linalg.vector_norm(inp.detach().float())
                self._slots[_INPUT] = torch.stack([norm, norm.new_tensor(float(inp.numel()))])

    def pull_compiled(self) -> None:
        """At the optimizer step: file what compiled forwards left in the slots since the last step (the model
        output and input on every step, every layer on fully observed steps)."""
        slots = self._slots
        if not slots or slots[_TICK] is self._pulled[_TICK]:
            return
        rec = self._rec
        if rec.clock.forward_begins():
            rec.commit()
        rec.coverage.forwards += 1
        pending = rec.pending
        full = pending.data.full
        for name in self._specs:
            packed = slots[name]
            if packed is self._pulled[name] or packed.numel() < 2:
                continue
            self._pulled[name] = packed
            if not name:
                pending.put("output", None, packed[0])
                pending.put("output_numel", None, packed[1])
            elif full:
                measure.file_compiled(pending, self._key_compiled(name), self._specs[name], packed)
        if slots[_INPUT] is not self._pulled[_INPUT] and slots[_INPUT].numel():
            self._pulled[_INPUT] = slots[_INPUT]
            pending.put("input", None, slots[_INPUT][0])
            pending.put("input_numel", None, slots[_INPUT][1])
        self._pulled[_TICK] = slots[_TICK]

    def _key_compiled(self, name: str) -> SlotKey:
        key = (name, 0)
        if key not in self._order_set:
            self._order_set.add(key)
            self.order.append(key)
        return key


def _closure(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``optimizer.step`` was given a closure (its forward and backward passes run inside the step). The
    step hooks receive the step's arguments with the optimizer itself first."""
    closure = args[1] if len(args) > 1 else kwargs.get("closure")
    return callable(closure)


class BackwardPath:
    """The backward pass and the optimizer step: gradients, clipping, updates, the head-gradient probe."""

    def __init__(self, rec: Recorder, model: nn.Module, forward: ForwardPath) -> None:
        self._rec = rec
        self._fwd = forward
        self._config = rec.config
        self._infos = rec.infos
        self.params: list[tuple[str, nn.Parameter]] = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._by_name = dict(self.params)
        self._owned: dict[int, tuple[weakref.ref[torch.optim.Optimizer], int, frozenset[str]]] = {}
        self._last: tuple[torch.optim.Optimizer | None, int, frozenset[str]] = (None, -1, frozenset())
        self._lr_seen: dict[int, list[Any]] = {}  # optimizer id -> its groups' learning rates at the last step
        self._raw: list[Tensor] | None = None  # gradient norms at the end of backward (fully observed steps)
        self._snapshot: stats.Snapshot | None = None
        self._captured = False
        self._clip_seen = False
        self._probe_mean = 0.0
        self._probe_count = 0
        self._head: tuple[nn.Parameter, str] | None = None

    def detach(self) -> None:
        self.drop()
        self._last = (None, -1, frozenset())

    def drop(self) -> None:
        self._snapshot = None
        self._raw = None

    def next_step(self) -> None:
        self._captured = False
        self._raw = None

    # --- the backward pass ------------------------------------------------------------------------------

    def on_backward_start(self, grad: Tensor) -> None:
        rec = self._rec
        if not rec.active:
            return
        try:
            fwd = self._fwd
            fwd.close()
            fwd.confirm()
            if fwd.output is not None:  # fully observed step, or a GPU step: every layer output, batched
                ends = [(target, t) for target, t in (("input", fwd.input), ("output", fwd.output)) if t is not None]
                measure.all_norms(
                    rec.pending, fwd.layer_refs(), [(n, t) for n, t in ends if t.is_floating_point()], grad
                )
                fwd.release()
            else:  # cheap CPU step, already checked at the end of the forward pass
                data = rec.pending.data
                data.target_grad = merge_max(data.target_grad, stats.host_norm(grad))
            rec.clock.backward_begins()
            wanted = rec.clock.mode is not StepMode.OPTIMIZER or (rec.pending.data.full and self._look_for_clipping())
            if wanted and not hooks.at_backward_end(self._on_backward_end):
                rec.warn_once("callback", "NeuralDBG: backward-end callbacks are unavailable")
        except Exception as exc:
            rec.fail("the backward hook of the model output", exc)

    def on_output_gradient(self, key: SlotKey, grad: Tensor) -> None:
        if self._rec.active:
            try:
                self._rec.pending.put("out_grad", key, stats.norms([grad])[0])
            except Exception as exc:
                self._rec.fail(f"the gradient hook of layer {key[0]!r}", exc)

    def _look_for_clipping(self) -> bool:
        """Whether this fully observed step also reads the gradients before the optimizer sees them: always once
        clipping was seen, otherwise in the first steps and every 16th step (a pass over every gradient)."""
        step = self._rec.clock.step
        return self._clip_seen or step < 16 or step % 16 == 0

    def _on_backward_end(self) -> None:
        """The gradients as the backward pass left them: compared with what reaches the optimizer (clipping in
        between hides an explosion), and, until an optimizer is known to step, the step's gradients."""
        rec = self._rec
        if not rec.active:
            return
        try:
            if not rec.pending.data.full:
                self._read_head_gradient()
                return
            with_grad, _ = measure.readable(self.params)
            grads = [g for _, _, g in with_grad]
            raw = stats.norms(grads) if grads and not self._fwd.autocast else None
            if rec.clock.mode is not StepMode.OPTIMIZER:
                # no optimizer (yet): read them now, the next zero_grad() may come before any optimizer step; an
                # optimizer step that does come reads them again (after clipping), with these as the raw norms
                self._capture()
            self._raw = raw
        except Exception as exc:
            rec.fail("the end of the backward pass", exc)

    # --- the optimizer step -------------------------------------------------------------------------------

    def on_optimizer_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        rec = self._rec
        if not rec.active:
            return
        try:
            if not self._owned_by(optimizer):
                return
            self._fwd.close()
            self._fwd.pull_compiled()
            closure = _closure(args, kwargs)
            fold, commit = rec.clock.optimizer_begins(closure)
            if fold:
                rec.fold()
            if commit:
                rec.commit()
            self._learning_rates(optimizer)
            if not closure:
                self._gradients_final(optimizer)
            elif rec.pending.data.full and self._config.track_updates and self._snapshot is None:
                # the update is measured across the step: snapshot every trainable parameter before the closure
                params = [(n, stats.dense(p.detach())) for n, p in self.params]
                kept = [(n, p) for n, p in params if p is not None]
                self._snapshot = stats.Snapshot([n for n, _ in kept], [p for _, p in kept])
        except Exception as exc:
            rec.fail("the optimizer step hook", exc)

    def on_optimizer_stepped(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """After ``optimizer.step(closure)``: the closure's gradients are final, the step is complete."""
        rec = self._rec
        if not (rec.active and rec.clock.in_closure):
            return
        try:
            if self._owned_by(optimizer) and rec.clock.optimizer_ends():
                self._fwd.close()
                self._gradients_final(optimizer)
        except Exception as exc:
            rec.fail("the optimizer step hook", exc)

    def _learning_rates(self, optimizer: torch.optim.Optimizer) -> None:
        rec = self._rec
        data = rec.pending.data
        lrs = [g.get("lr", 0.0) for g in optimizer.param_groups]
        seen = self._lr_seen.get(id(optimizer))
        if seen is not None and seen != lrs:
            data.lr_changed = True
            rec.schedule.trigger(rec.clock.step + 1)
            if not self._captured:
                data.full = True  # measure this step's update, the first with the new learning rate
        self._lr_seen[id(optimizer)] = lrs

    def _gradients_final(self, optimizer: torch.optim.Optimizer) -> None:
        data = self._rec.pending.data
        self.capture_once()
        if data.full:
            names = {id(p): n for n, p in self.params}
            for group in optimizer.param_groups:
                lr = float(group.get("lr", 0.0))
                for p in group["params"]:
                    name = names.get(id(p))
                    if name is not None:
                        data.stepped[name] = max(lr, data.stepped.get(name, 0.0))

    def _owned_by(self, optimizer: torch.optim.Optimizer) -> frozenset[str]:
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
            ours = {id(p): n for n, p in self.params}
            owned = frozenset(ours[id(p)] for g in groups for p in g["params"] if id(p) in ours)
            self._owned[id(optimizer)] = (weakref.ref(optimizer), size, owned)
        self._last = (optimizer, size, owned)
        return owned

    # --- gradients and updates ----------------------------------------------------------------------------

    def capture_once(self) -> None:
        """Read the step's gradients, once per step (several optimizers may step in one iteration)."""
        if not self._captured:
            if self._rec.pending.data.full:
                self._capture()
            else:
                self._read_head_gradient()
            self._captured = True

    def _capture(self) -> None:
        """A fully observed step's gradient statistics (read again at the optimizer step when read at the end of
        backward before an optimizer was known: what the optimizer receives, after clipping, is what counts)."""
        rec = self._rec
        pending = rec.pending
        with_grad, skipped = measure.readable(self.params)
        if skipped:
            rec.coverage.skip(rec.clock.step, skipped, "meta tensors or an unsupported tensor subclass")
            rec.warn_once(
                "skipped",
                f"NeuralDBG cannot read the gradients of {', '.join(map(repr, skipped[:3]))}"
                f"{' and more' if len(skipped) > 3 else ''}: they are left out of the statistics",
            )
        if not with_grad:
            return
        raw, self._raw = self._raw or [], None
        measure.gradients(pending.data, with_grad, raw)
        self._clip_seen |= pending.data.grad_clip_factor is not None
        head = self._find_head()
        if head is not None:
            pending.data.head_grad = pending.data.grad.get(head[1])
        by_param = {n: g for n, _, g in with_grad}
        fwd = self._fwd
        covered = {key for key in fwd.never_positive if fwd.activated_by_module(key)}
        measure.functional_dead(pending, fwd.never_positive, self._infos, by_param, covered)
        fwd.never_positive.clear()
        if self._config.track_updates and self._snapshot is None:
            params = [(n, stats.dense(p.detach())) for n, p, _ in with_grad]
            kept = [(n, p) for n, p in params if p is not None]
            self._snapshot = stats.Snapshot([n for n, _ in kept], [p for _, p in kept])

    def file_updates(self) -> None:
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is not None and snapshot.names:
            measure.updates(self._rec.pending, snapshot)

    def _find_head(self) -> tuple[nn.Parameter, str] | None:
        """The parameter whose gradient stands for the loss's reach: the last parametric layer's weight (or its
        smallest parameter when the weight is huge, like a language-model head)."""
        if self._head is None and self._fwd.order:
            for layer, _ in reversed(self._fwd.order):
                names = [n for n in self._infos[layer].params if n in self._by_name]
                if names:
                    params = sorted(names, key=lambda n: self._by_name[n].numel())
                    weight = self._infos[layer].unit_weight or ""
                    pick = weight if weight in self._by_name and self._by_name[weight].numel() <= 1 << 20 else params[0]
                    self._head = (self._by_name[pick], pick)
                    break
        return self._head

    def _read_head_gradient(self) -> None:
        """A cheap step's only look at the loss: the first element of the head layer's gradient. A non-finite loss
        (a mean over the batch) makes every element of it non-finite, so one element tells."""
        head = self._head or self._find_head()
        grad = head[0].grad if head is not None else None
        if grad is None or not grad.is_cpu or not self._fwd.host_reads_are_free or grad.numel() == 0:
            return
        if type(grad) is not Tensor or grad.layout is not torch.strided:
            return
        value = float(grad.reshape(-1)[0])
        rec = self._rec
        rec.pending.data.head_finite = math.isfinite(value)
        # an outlier batch shows as a jump of this element against its running mean: observe what follows
        magnitude = abs(value)
        if self._probe_count >= 8 and magnitude > 20 * self._probe_mean + 1e-12:
            rec.schedule.trigger(rec.clock.step + 1)
        if math.isfinite(magnitude):
            self._probe_mean += (magnitude - self._probe_mean) / min(self._probe_count + 1, 16)
            self._probe_count += 1
