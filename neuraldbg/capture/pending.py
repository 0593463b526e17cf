"""One step being collected: host fields, plus 0-d device tensors moved to the host at the next flush.

:class:`Pending` holds the step in progress (a :class:`~neuraldbg.stats.step.StepData` and the device tensors that
still have to be filed into it); :func:`assign` files a flushed value into its field.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from ..stats import tensors as stats
from ..stats.step import StepData

#: Readings taken from scaled gradients (or from a step's update), meaningless once the GradScaler skipped the step.
_SCALED = frozenset(
    {
        "target_grad",
        "target_grad_sum",
        "out_grad",
        "func_dead",
        "delta",
        "weight",
        "before",
        "grad_check",
        "output_dead_pulled",
    }
)


class Pending:
    """One step being collected: host fields, plus device tensors to move in the next flush."""

    __slots__ = ("captured", "data", "lost", "restart", "targets", "tensors")

    def __init__(self, step: int, full: bool) -> None:
        self.data = StepData(step, full)
        self.tensors: list[Tensor] = []
        self.targets: list[tuple[str, Any, float]] = []
        self.captured: Tensor | None = None  # the loss whose gradient is in .grad (see capture.ledger)
        self.lost = False  # a backward pass of that gradient started from something that is not a loss
        self.restart = False  # a backward pass of this part found the gradients reset: earlier parts do not count

    def capture(self, loss: Tensor | None, restart: bool, keep_first: bool = False) -> None:
        """A backward pass that reached the model started from ``loss`` (None: not a loss). ``restart``: it found
        the gradients reset (or as the last optimizer step left them), so its loss begins the sum; otherwise it
        adds to it. ``keep_first``: inside ``optimizer.step(closure)``, a later evaluation does not replace the
        first (the loss at the parameters the step started from)."""
        if restart:
            if keep_first and (self.captured is not None or self.lost):
                return
            self.captured, self.lost, self.restart = loss, loss is None, True
        elif loss is None or self.lost:
            self.captured, self.lost = None, True
        else:
            self.captured = loss if self.captured is None else self.captured + loss

    def put(self, target: str, key: Any, tensor: Tensor, extra: float = 0) -> None:
        self.targets.append((target, key, extra))
        self.tensors.append(tensor)

    def skip(self) -> None:
        """The GradScaler skipped this step: drop what was read from its scaled gradients (overflow, not the model's
        gradients) and its update (there was none). A NaN loss gradient is kept (see :func:`assign`): scaling
        makes inf, not NaN, so a NaN says the loss itself was NaN."""
        data = self.data
        data.skipped = True
        kept = [
            (target, t)
            for target, t in zip(self.targets, self.tensors)
            if target[0] not in _SCALED or target[0] == "target_grad"
        ]
        self.targets = [target for target, _ in kept]
        self.tensors = [t for _, t in kept]
        if data.target_grad is not None and not math.isnan(data.target_grad):
            data.target_grad = None
        data.target_grad_sum = None
        readings_of_step = (data.grad, data.grad_numel, data.out_grad, data.func_dead, data.update, data.update_parts)
        for readings in (*readings_of_step, data.update_before):
            readings.clear()
        data.grad_exact_zero.clear()
        data.grad_nonfinite.clear()
        data.stepped.clear()
        data.head_grad = data.head_finite = data.grad_clip_factor = None

    def unscale(self, scale: Tensor) -> None:
        """Divide a GradScaler's scale out of the loss and output gradients read so far (a scaler found only at
        the step's optimizer step, after its backward pass was read)."""
        self.tensors = [
            t / scale if target[0] in ("target_grad", "target_grad_sum", "out_grad", "captured_loss") else t
            for target, t in zip(self.targets, self.tensors)
        ]
        if self.captured is not None:
            self.captured = self.captured / scale
        if self.data.target_grad is not None:
            self.data.target_grad /= float(scale)

    def absorb(self, other: Pending) -> None:
        """Take in what ``other`` recorded of the same step (a staged forward pass, a micro-batch): its device
        tensors, and its host readings, keeping the worst of two readings."""
        self.tensors.extend(other.tensors)
        self.targets.extend(other.targets)
        if other.restart:
            self.captured, self.lost, self.restart = other.captured, other.lost, True
        elif other.lost or self.lost:
            self.captured, self.lost = None, self.lost or other.lost
        elif other.captured is not None:
            self.captured = other.captured if self.captured is None else self.captured + other.captured
        src, dst = other.data, self.data
        dst.classes = src.classes or dst.classes
        if src.probabilities is not None:
            dst.probabilities = (
                src.probabilities if dst.probabilities is None else dst.probabilities and src.probabilities
            )
        dst.carried = src.carried or dst.carried
        dst.carried_by = src.carried_by or dst.carried_by
        if src.grad_carried is not None:
            dst.grad_carried = merge_max(dst.grad_carried, src.grad_carried)
        dst.numel.update(src.numel)
        dst.input_numel = src.input_numel or dst.input_numel
        dst.forwards += src.forwards
        dst.output_numel = src.output_numel or dst.output_numel
        if src.output_norm is not None:
            dst.output_norm = merge_max(dst.output_norm, src.output_norm)
        if src.input_norm is not None:
            dst.input_norm = merge_max(dst.input_norm, src.input_norm)
        if src.target_grad is not None:
            dst.target_grad = merge_max(dst.target_grad, src.target_grad)
        if src.target_grad_sum is not None:
            dst.target_grad_sum = merge_max(dst.target_grad_sum, src.target_grad_sum)
        for key, value in src.act.items():
            dst.act[key] = merge_max(dst.act.get(key), value)


def merge_max(old: float | None, new: float) -> float:
    """Keep the worst of two readings of one step (gradient accumulation); NaN wins."""
    if old is None:
        return new
    if math.isnan(old) or math.isnan(new):
        return math.nan
    return max(old, new)


def assign(data: StepData, target: str, key: Any, extra: float, value: float) -> None:
    if target == "act":
        data.act[key] = merge_max(data.act.get(key), value)
    elif target == "input":
        data.input_norm = merge_max(data.input_norm, value)
    elif target == "output":
        data.output_norm = merge_max(data.output_norm, value)
    elif target == "target_grad":
        if data.skipped and not math.isnan(value):
            return  # a skipped step's scaled loss gradient overflowed: not the loss's
        data.target_grad = merge_max(data.target_grad, value)
    elif target == "target_grad_sum":
        if not data.skipped:
            data.target_grad_sum = merge_max(data.target_grad_sum, value)
    elif target == "loss":
        data.loss = value
        data.loss_observed = True
    elif target == "captured_loss":
        data.loss = value
    elif target == "probabilities":
        data.probabilities = value > 0 if data.probabilities is None else data.probabilities and value > 0
    elif target == "carried":
        data.grad_carried = merge_max(data.grad_carried, value)
    elif target == "loss_scale":
        data.loss_scale = value
    elif target == "dead":
        data.dead[key] = (value, int(extra))
    elif target == "output_dead_pulled":
        data.output_dead_pulled = (value, int(extra))
    elif target == "func_dead":
        data.func_dead[key] = (value, int(extra))
    elif target == "saturated":
        data.saturated[key] = (value, int(extra))
    elif target == "numel":  # a compiled step's output size
        data.numel[key] = int(value)
    elif target == "output_numel":
        data.output_numel = int(value)
    elif target == "input_numel":
        data.input_numel = int(value)
    elif target == "units":  # a compiled step's unit count, filed right after its dead or saturated count
        counts = data.dead if key in data.dead else data.saturated
        if key in counts:
            counts[key] = (counts[key][0], int(value))
    elif target == "grad_check":  # a cheap step's largest gradient element: filed only when it is inf or NaN
        if not math.isfinite(value) and not data.skipped:
            data.grad[key] = value
            data.grad_numel[key] = int(extra)
            data.grad_nonfinite.add(key)
    elif target == "out_grad":
        data.out_grad[key] = merge_max(data.out_grad.get(key), value)
    elif target in ("delta", "weight", "before"):  # one snapshot reading: delta, weight, then before
        parts = data.update_parts.setdefault(key, [])
        parts.append(value)
        if target == "delta":
            parts.append(extra)  # the sample's scale: 1 when the parameter was copied whole
        if target == "before":
            delta, scale, after, before = parts[:4]
            data.update[key] = (stats.update_norm(delta, scale, after, before), after)
            data.update_before[key] = before
            del data.update_parts[key]
    else:  # pragma: no cover - a programming error, not a user error
        raise KeyError(target)
