"""Reading a step's parameter gradients and what the optimizer does to the weights."""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..model import naming
from ..model.shards import Param
from ..stats import tensors as stats
from . import measure
from .order import LayerOrder

if TYPE_CHECKING:
    from .forward import ForwardPath
    from .recorder import Recorder


class GradientReader:
    """Gradients once per step (full statistics, or one element of the head layer's gradient on cheap steps),
    the raw norms left by the backward pass (to see clipping), and the snapshot that measures the update."""

    def __init__(self, rec: Recorder, model: nn.Module, forward: ForwardPath) -> None:
        self._rec = weakref.proxy(rec)  # the recorder owns this part (see Recorder.__init__)
        self._fwd = forward
        self._order: LayerOrder = forward.order
        self._infos = rec.infos
        self._track_updates = rec.config.track_updates
        every = naming.parameters(model)
        self.params: list[Param] = [p for p in every if p.requires_grad]
        self._by_name = {p.name: p for p in self.params}
        # parameters without requires_grad when the debugger was made (a backbone frozen on purpose): read from the
        # first fully observed step after one is switched on (see adopt_unfrozen)
        self._unfrozen_later: list[Param] = [p for p in every if not p.requires_grad]
        # gradient norms at the end of backward (fully observed steps): a 1-d tensor, or 0-d ones on several devices
        self.raw: Tensor | list[Tensor] | None = None
        self.snapshot: stats.Snapshot | None = None
        self._held: stats.Snapshot | None = None  # taken before a closure step, for the step it will serve
        # what a snapshot copies, by the parameters it is of, kept while they keep their storage
        self._plans: dict[tuple[str, ...], stats.SnapshotPlan] = {}
        self.captured = False
        self.clip_seen = False
        self._probe_mean = 0.0
        self._probe_count = 0
        self._probe_at = 0  # the element of the head gradient a cheap step reads (see read_head)
        self._head: Param | None = None
        self._head_bias: Param | None = None
        self._whole: list[Tensor] | None = None  # the parameters, when each is held whole (see check_finite)
        self._flat = False  # ... their gradients are checked as one flat copy (stats.flat_check_pays) ...
        self._plan: stats.FlatSum | None = None  # ... summed shape by shape where shapes repeat
        # gradients left from before the debugger attached, as they were then: not this run's until a backward
        # pass writes them (see attach)
        self._stale: dict[str, tuple[weakref.ref[Tensor], int]] = {}

    def attach(self) -> None:
        """Note the gradients the parameters already hold: a teacher trained earlier in the script and then used
        under ``no_grad``, a backbone pretrained before a probe, keep their last ``.grad`` through the whole run.
        Until a backward pass writes one (a new tensor, or its version counter moves), it is no gradient of this
        run: it says nothing of what the loss does to that parameter, and the optimizer that stepped it is gone."""
        self._stale = {}
        for p in self.params:
            g = p.tensor.grad
            if isinstance(g, Tensor):
                self._stale[p.name] = (weakref.ref(g), g._version)

    def _fresh(self, with_grad: list[tuple[str, Param, Tensor]]) -> list[tuple[str, Param, Tensor]]:
        """``with_grad`` without the gradients still as they were when the debugger attached; those written since
        are forgotten as stale, so the check ends once every one was written."""
        stale = self._stale
        kept = []
        for name, p, g in with_grad:
            found = stale.get(name)
            if found is not None:
                grad = p.tensor.grad
                if found[0]() is grad and grad is not None and grad._version == found[1]:
                    continue
                del stale[name]
            kept.append((name, p, g))
        return kept

    def drop(self) -> None:
        self.snapshot = self._held = None
        self.raw = None

    def next_step(self) -> None:
        self.captured = False
        self.raw = None

    def raw_norms(self, loss_scale: Tensor | None = None) -> Tensor | list[Tensor] | None:
        """The gradient norms as the backward pass left them, ``loss_scale`` (a GradScaler's scale, still in them)
        divided out. None under autocast without a known scaler: an unknown scale may sit between them and the
        optimizer."""
        if self._fwd.autocast and loss_scale is None and not self._rec.scaler.active:
            return None
        with_grad, _ = measure.readable(self.params)
        grads = [g for _, _, g in with_grad]
        if not grads:
            return None
        norms = stats.norm_readings(grads)
        if loss_scale is None:
            return norms
        return norms / loss_scale if isinstance(norms, Tensor) else [n / loss_scale for n in norms]

    def once(self, loss_scale: float = 1.0) -> None:
        """Read the step's gradients, once per step (several optimizers may step in one iteration). ``loss_scale``:
        a GradScaler's scale still in them."""
        if not self.captured:
            if self._rec.pending.data.full:
                self.capture(loss_scale)
            else:
                self.read_head(loss_scale)
                self.check_finite()
            self.captured = True

    def check_finite(self) -> None:
        """A cheap step's look at what the optimizer receives: for each parameter's gradient a probe that is inf or
        NaN exactly when the gradient holds one (:func:`~neuraldbg.stats.tensors.device_finite_probes`), and their
        sum, non-finite exactly when one of them is, filed with the probes as its key: read at the next flush with
        the step's other readings (no sync now), the probes only when it is not finite. On a CPU (host reads cost
        no sync) one cheap reduction per gradient (a norm, or a sum for a large float32 one), summed and read at
        once, says first whether every gradient is surely finite
        (:func:`~neuraldbg.stats.tensors.surely_finite`); only when not are the probes taken. So a step costs one
        reduction per tensor and one reading, whatever the number of parameters. An inf or NaN files that
        gradient as non-finite at this very step (see :func:`~neuraldbg.capture.pending.assign`), so it is dated
        where it happened, not at the next fully observed step."""
        host = self._fwd.host_reads_are_free
        verdict = self._cpu_grads_surely_finite() if host else None
        if verdict:
            return
        with_grad, _ = measure.readable(self.params)  # unreadable gradients are reported by the full steps
        if not with_grad:
            return
        pending = self._rec.pending
        grads = [g for _, _, g in with_grad]
        on_host = host and all(g.is_cpu for g in grads)
        if on_host and verdict is None and stats.surely_finite(grads):  # False: already looked, look closer
            return
        probes = stats.device_finite_probes(grads)
        total = None if on_host else stats.probe_sum(probes)
        if total is None:  # a closer look on a CPU, or probes on several devices: each probe filed on its own
            for (name, _, grad), probe in zip(with_grad, probes):
                pending.put("grad_check", name, probe, grad.numel())
            return
        checked = [(name, grad.numel()) for name, _, grad in with_grad]
        pending.put("grad_checks", (checked, probes), total)

    def _cpu_grads_surely_finite(self) -> bool | None:
        """The common case in a few calls over all gradients at once: parameters held whole, their gradients
        plain CPU tensors (:func:`~neuraldbg.stats.tensors.all_dense_on_cpu`); then whether they are all surely
        finite (False: look closer, with the probes). None when the case is not the common one: the long way
        (:func:`measure.readable`) decides.

        For a list summed flat (float32 parameters, see :func:`~neuraldbg.stats.tensors.flat_check_pays`) only the
        gradients' types are checked, not their layout, dtype and device tensor by tensor (3 ms a step for 5,000
        gradients, twice the sum): torch gives a parameter's gradient its dtype and device (assigning another
        raises), and the sum's copies raise on a sparse or meta gradient or one on another device, which then goes
        the long way."""
        if self._whole is None:
            self._whole = [p.tensor for p in self.params] if all(p.piece is None for p in self.params) else []
            self._flat = stats.flat_check_pays(self._whole)
            plan = stats.FlatSum([t.shape for t in self._whole]) if self._flat else None
            self._plan = plan if plan is not None and plan.groups else None
        if not self._whole:
            return None
        grads = list(map(stats.grad_of, self._whole))
        if any(map(stats.is_none, grads)):
            grads = [g for g in grads if g is not None]
        if self._flat and grads and stats.plain_types(grads):
            try:
                return stats.surely_finite(grads, flat=True, plan=self._plan)
            except RuntimeError:  # a sparse gradient, or one on another device (see above)
                return None
        dtypes = stats.dense_cpu_dtypes(grads) if grads else None
        if dtypes is None:
            return None
        # a gradient's dtype may differ from its parameter's: the flat sum takes float32 only; the plan serves the
        # whole list only (surely_finite copies a list with a gradient missing flat)
        return stats.surely_finite(grads, flat=self._flat and dtypes == {torch.float32}, plan=self._plan)

    def adopt_unfrozen(self) -> None:
        """Follow the parameters switched to ``requires_grad=True`` since the debugger was made, as if they had
        always required one: a backbone unfrozen after a warm-up gets gradients from then on, and is measured like
        the rest (its updates too: one left out of the optimizer is frozen, see
        :mod:`neuraldbg.kinds.frozen_parameters`). The list only grows (one switched off again has no gradient to
        read)."""
        switched = [p for p in self._unfrozen_later if p.tensor.requires_grad]
        if not switched:
            return
        self._unfrozen_later = [p for p in self._unfrozen_later if not p.tensor.requires_grad]
        self.params.extend(switched)  # the same list: the backward path and the ledger read it
        self._by_name.update((p.name, p) for p in switched)
        self._whole = None  # the cheap steps' finite check covers them from now on
        self._head = None
        self._probe_at = 0
        self._rec.backward.forget_owners()  # which optimizer holds which parameter: asked again

    def capture(self, loss_scale: float = 1.0) -> None:
        """A fully observed step's gradient statistics. Read again at the optimizer step when first read at the end
        of backward before an optimizer was known: what the optimizer receives, after clipping, is what counts.
        ``loss_scale``: a GradScaler's scale still in the gradients (read before the scaler unscaled them)."""
        if self._unfrozen_later:
            self.adopt_unfrozen()
        rec = self._rec
        pending = rec.pending
        with_grad, skipped = measure.readable(self.params)
        if self._stale:
            with_grad = self._fresh(with_grad)
        if skipped:
            rec.coverage.skip(rec.clock.step, skipped, "meta tensors or an unsupported tensor subclass")
            more = " and more" if len(skipped) > 3 else ""
            rec.warn_once(
                "skipped",
                f"NeuralDBG cannot read the gradients of {', '.join(map(repr, skipped[:3]))}{more}: they are "
                "left out, and the verdict reports the run as incompletely observed",
            )
        if not with_grad:
            return
        raw, self.raw = self.raw, None
        measure.gradients(pending.data, with_grad, raw, loss_scale)
        self.clip_seen |= pending.data.grad_clip_factor is not None
        head = self.head()
        if head is not None:
            pending.data.head_grad = pending.data.grad.get(head.name)
        by_param = {n: g for n, _, g in with_grad}
        fwd = self._fwd
        covered = {key for key in fwd.never_positive if self._order.activated_by_module(key)}
        measure.functional_dead(pending, fwd.never_positive, self._infos, by_param, covered)
        fwd.never_positive.clear()
        if self._track_updates and self.snapshot is None:
            self.take_snapshot([p for _, p, _ in with_grad])

    def take_snapshot(self, params: list[Param], held: bool = False) -> None:
        """Copy what measures the update of these parameters (before the optimizer changes them): the part this
        process holds of each."""
        key = tuple(p.name for p in params)
        plan = self._plans.get(key)
        # a plan kept from step to step holds views of parameters held whole; one of sharded parameters (whose
        # storage FSDP frees and reallocates) is made for each step
        if plan is None or not plan.valid_for([p.tensor for p in params]):
            parts = [(p.name, p.local(p.tensor.detach())) for p in params]
            kept = [(name, d) for name, d in parts if d is not None and d.numel()]
            plan = stats.SnapshotPlan([n for n, _ in kept], [d for _, d in kept])
            if len(kept) == len(params) and all(p.whole for p in params):
                if len(self._plans) >= 8:
                    self._plans.clear()
                self._plans[key] = plan
        snapshot = plan.take()
        if held:
            self._held = snapshot
        else:
            self.snapshot = snapshot

    def hold_snapshot(self, params: list[Param]) -> None:
        """Before ``optimizer.step(closure)``: copy the parameters now, for the step the closure serves (the step
        in progress may still have to be committed, with its own snapshot)."""
        if self._held is None:
            self.take_snapshot(params, held=True)

    def adopt_snapshot(self) -> None:
        """The step a held snapshot was taken for is now the step in progress."""
        if self._held is not None:
            if self.snapshot is None:
                self.snapshot = self._held
            self._held = None

    def file_updates(self) -> None:
        snapshot, self.snapshot = self.snapshot, None
        if snapshot is not None and snapshot.names:
            measure.updates(self._rec.pending, snapshot)

    def head(self) -> Param | None:
        """The parameter whose gradient stands for the loss's reach: the last parametric layer's weight (or its
        smallest parameter when the weight is huge, like a language-model head), among those this process holds
        a part of."""
        if self._head is None and self._order.keys:
            for layer, _ in reversed(self._order.keys):
                names = [n for n in self._infos[layer].params if n in self._by_name and self._holds(n)]
                if names:
                    smallest = min(names, key=lambda n: self._by_name[n].numel)
                    weight = self._infos[layer].unit_weight or ""
                    pick = weight if weight in names and self._by_name[weight].numel <= 1 << 20 else smallest
                    self._head = self._by_name[pick]
                    # a bias of the head layer: exactly zero only when the loss gives no gradient (a weight's
                    # gradient is also zero when the layer's input is, behind a dead layer)
                    biases = [n for n in names if n != pick and self._by_name[n].tensor.dim() == 1]
                    self._head_bias = self._by_name[biases[0]] if biases else None
                    break
        return self._head

    def _holds(self, name: str) -> bool:
        part = self._by_name[name].local(self._by_name[name].tensor.detach())
        return part is not None and part.numel() > 0

    def _zero_head(self, grad: Tensor) -> bool | None:
        """Whether the loss gave the head layer no gradient at all on this cheap CPU step (the element probed read 0):
        the whole head gradient and its layer's bias gradient are exactly zero (CPU reads, only then). None when the
        layer has no bias: its weight's gradient is also zero when its input is (behind a dead layer)."""
        bias = self._head_bias
        if bias is None or stats.any_nonzero(grad):
            return None if bias is None else False
        g = bias.tensor.grad
        if g is None or not g.is_cpu or bias.piece is not None or type(g) is not Tensor:
            return None
        return not stats.any_nonzero(g)

    def read_head(self, loss_scale: float = 1.0) -> None:
        """A cheap step's only look at the loss: one element of the head layer's gradient, the first until it reads
        exactly 0 while the rest of the head gets a gradient (its input unit is dead: it would read 0 on every step,
        and a jump of the loss's gradient would never show); from then on the element that got the largest. A
        non-finite loss (a mean over the batch) makes every element of it non-finite, so one element tells.
        ``loss_scale``: a GradScaler's scale still in the gradient."""
        head = self._head or self.head()
        full = head.tensor.grad if head is not None else None
        if full is None or not full.is_cpu or not self._fwd.host_reads_are_free:
            return
        grad = full if head is not None and head.piece is None and type(full) is Tensor else None
        if grad is None and head is not None:
            grad = head.local(full)
        if grad is None or grad.numel() == 0 or grad.layout is not torch.strided:
            return
        at = self._probe_at if self._probe_at < grad.numel() else 0
        if grad.numel() <= 64 and at == 0:  # a small head: reading it whole costs less than indexing one element
            first = grad.tolist()
            while isinstance(first, list):
                first = first[0]
            value = float(first) / loss_scale
        else:
            value = float(grad.reshape(-1)[at]) / loss_scale
        rec = self._rec
        rec.pending.data.head_finite = math.isfinite(value)
        if value == 0.0:
            zero = self._zero_head(grad)
            rec.pending.data.head_zero = zero
            if zero is False or (zero is None and stats.any_nonzero(grad)):
                # this element gets no gradient and others do: watch the one that gets the most, with its own mean
                self._probe_at = int(grad.detach().reshape(-1).abs().argmax())
                self._probe_mean, self._probe_count = 0.0, 0
            return
        rec.pending.data.head_zero = False
        # an outlier batch shows as a jump of this element against its running mean: observe what follows
        magnitude = abs(value)
        if self._probe_count >= 8 and magnitude > 20 * self._probe_mean + 1e-12:
            rec.schedule.trigger(rec.clock.step + 1)
        if math.isfinite(magnitude):
            self._probe_mean += (magnitude - self._probe_mean) / min(self._probe_count + 1, 16)
            self._probe_count += 1
