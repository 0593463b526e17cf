"""Reading a step's parameter gradients and what the optimizer does to the weights."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from .. import measure, naming, stats
from .order import LayerOrder

if TYPE_CHECKING:
    from ..recorder import Recorder
    from .forward import ForwardPath


class GradientReader:
    """Gradients once per step (full statistics, or one element of the head layer's gradient on cheap steps),
    the raw norms left by the backward pass (to see clipping), and the snapshot that measures the update."""

    def __init__(self, rec: Recorder, model: nn.Module, forward: ForwardPath) -> None:
        self._rec = rec
        self._fwd = forward
        self._order: LayerOrder = forward.order
        self._infos = rec.infos
        self._track_updates = rec.config.track_updates
        self.params: list[tuple[str, nn.Parameter]] = [
            (n, p) for n, p in naming.named_parameters(model) if p.requires_grad
        ]
        self._by_name = dict(self.params)
        self.raw: list[Tensor] | None = None  # gradient norms at the end of backward (fully observed steps)
        self.snapshot: stats.Snapshot | None = None
        self._held: stats.Snapshot | None = None  # taken before a closure step, for the step it will serve
        self.captured = False
        self.clip_seen = False
        self._probe_mean = 0.0
        self._probe_count = 0
        self._head: tuple[nn.Parameter, str] | None = None

    def drop(self) -> None:
        self.snapshot = self._held = None
        self.raw = None

    def next_step(self) -> None:
        self.captured = False
        self.raw = None

    def raw_norms(self) -> list[Tensor] | None:
        """The gradient norms as the backward pass left them (None under autocast, where a GradScaler's scale
        sits between them and the optimizer)."""
        with_grad, _ = measure.readable(self.params)
        grads = [g for _, _, g in with_grad]
        return stats.norms(grads) if grads and not self._fwd.autocast else None

    def once(self) -> None:
        """Read the step's gradients, once per step (several optimizers may step in one iteration)."""
        if not self.captured:
            if self._rec.pending.data.full:
                self.capture()
            else:
                self.read_head()
            self.captured = True

    def capture(self) -> None:
        """A fully observed step's gradient statistics. Read again at the optimizer step when first read at the end
        of backward before an optimizer was known: what the optimizer receives, after clipping, is what counts."""
        rec = self._rec
        pending = rec.pending
        with_grad, skipped = measure.readable(self.params)
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
        raw, self.raw = self.raw or [], None
        measure.gradients(pending.data, with_grad, raw)
        self.clip_seen |= pending.data.grad_clip_factor is not None
        head = self.head()
        if head is not None:
            pending.data.head_grad = pending.data.grad.get(head[1])
        by_param = {n: g for n, _, g in with_grad}
        fwd = self._fwd
        covered = {key for key in fwd.never_positive if self._order.activated_by_module(key)}
        measure.functional_dead(pending, fwd.never_positive, self._infos, by_param, covered)
        fwd.never_positive.clear()
        if self._track_updates and self.snapshot is None:
            self.take_snapshot([(n, p) for n, p, _ in with_grad])

    def take_snapshot(self, named: list[tuple[str, nn.Parameter]], held: bool = False) -> None:
        """Copy what measures the update of these parameters (before the optimizer changes them)."""
        kept = [(n, d) for n, d in ((n, stats.dense(p.detach())) for n, p in named) if d is not None]
        snapshot = stats.Snapshot([n for n, _ in kept], [d for _, d in kept])
        if held:
            self._held = snapshot
        else:
            self.snapshot = snapshot

    def hold_snapshot(self, named: list[tuple[str, nn.Parameter]]) -> None:
        """Before ``optimizer.step(closure)``: copy the parameters now, for the step the closure serves (the step
        in progress may still have to be committed, with its own snapshot)."""
        if self._held is None:
            self.take_snapshot(named, held=True)

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

    def head(self) -> tuple[nn.Parameter, str] | None:
        """The parameter whose gradient stands for the loss's reach: the last parametric layer's weight (or its
        smallest parameter when the weight is huge, like a language-model head)."""
        if self._head is None and self._order.keys:
            for layer, _ in reversed(self._order.keys):
                names = [n for n in self._infos[layer].params if n in self._by_name]
                if names:
                    smallest = min(names, key=lambda n: self._by_name[n].numel())
                    weight = self._infos[layer].unit_weight or ""
                    pick = weight if weight in self._by_name and self._by_name[weight].numel() <= 1 << 20 else smallest
                    self._head = (self._by_name[pick], pick)
                    break
        return self._head

    def read_head(self) -> None:
        """A cheap step's only look at the loss: the first element of the head layer's gradient. A non-finite loss
        (a mean over the batch) makes every element of it non-finite, so one element tells."""
        head = self._head or self.head()
        grad = head[0].grad if head is not None else None
        if grad is None or not grad.is_cpu or not self._fwd.host_reads_are_free or grad.numel() == 0:
            return
        if type(grad) is not Tensor or grad.layout is not torch.strided:
            return
        if grad.numel() <= 64:  # a small head: reading it whole costs less than indexing one element
            first = grad.tolist()
            while isinstance(first, list):
                first = first[0]
            value = float(first)
        else:
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
