"""Mixed precision with a GradScaler: the scale inside the gradients, and the iterations the scaler skipped.

``scaler.scale(loss).backward()`` leaves every gradient multiplied by the scale; ``scaler.step(optimizer)``
unscales them, and steps the optimizer only when they are all finite; ``scaler.update()`` then lowers the scale
after a skip (``backoff_factor``) or raises it after ``growth_interval`` clean steps. So:

* what the debugger reads during the backward pass (the loss gradient, layer output gradients, parameter
  gradients at the end of backward) is divided by the scale of that backward pass; what it reads at the optimizer
  step inside ``scaler.step`` is already unscaled;
* a skipped iteration runs no optimizer step at all, so no optimizer hook sees it. It is told apart from a
  micro-batch of gradient accumulation by ``update()``: every iteration calls it once, after the step, and
  accumulation does not call it between micro-batches. ``update()`` replaces the scaler's per-iteration record
  (``_per_optimizer_states``), so "it ran since the last forward pass began, and no optimizer stepped" is a
  skip, checked at the next forward pass with one identity comparison (no host read);
* an optimizer that unscales in its own kernel (``fused=True``) is stepped by the scaler even when the update is
  to be skipped, with the gradients still scaled: the scale is ``optimizer.grad_scale`` and a skip is
  ``optimizer.found_inf``, both set for the duration of the step (see ``BackwardPath``);
* a skipped step is a step: it is counted and kept (its forward statistics are evidence like any other), but its
  gradient readings are scaled overflow, not the model's gradients, and are dropped - except a NaN loss
  gradient, which no scale makes (overflow gives inf): a loss that was NaN before scaling is still reported.

The scaler is given (``NeuralDbg(model, grad_scaler=scaler)``) or found at the first optimizer steps: the
optimizer step hooks run inside ``GradScaler.step``, whose frame is a few frames up (looked for only while none
is known and only in the first steps, a few microseconds each).
"""

from __future__ import annotations

import math
import sys
from types import CodeType, FrameType
from typing import Any

import torch
from torch import Tensor

#: Owned optimizer steps during which the stack is searched for a GradScaler when none was given.
DISCOVERY_STEPS = 16
#: Frames searched above the optimizer step hook (hook <- the collector's pause around it, see
#: :mod:`neuraldbg.capture.collector` <- step wrapper <- _maybe_opt_step <- GradScaler.step), with a margin.
_DISCOVERY_DEPTH = 7


def is_grad_scaler(obj: object) -> bool:
    """A ``torch.amp.GradScaler`` (``torch.cuda.amp.GradScaler`` and FSDP's ``ShardedGradScaler`` subclass it)."""
    scaler_type = getattr(torch.amp, "GradScaler", None)
    return scaler_type is not None and isinstance(obj, scaler_type)


#: The methods of a GradScaler that call the optimizer's step (see :func:`_scaler_step_codes`).
_STEP_NAMES = ("step", "_maybe_opt_step")


def _scaler_step_codes() -> frozenset[CodeType]:
    """The code of ``GradScaler.step`` and ``_maybe_opt_step``, in GradScaler and every subclass defined so far."""
    root = getattr(torch.amp, "GradScaler", None)
    if root is None:
        return frozenset()
    codes: set[CodeType] = set()
    todo: list[type] = [root]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        for name in _STEP_NAMES:
            fn = cls.__dict__.get(name)
            code = getattr(fn, "__code__", None)
            if isinstance(code, CodeType):
                codes.add(code)
    return frozenset(codes)


class ScalerWatch:
    """The GradScaler of a watched run (if any): its scale, and whether an iteration was skipped."""

    def __init__(self, scaler: Any = None) -> None:
        self.scaler: Any = None
        self._states: object = None  # the scaler's per-iteration record when last looked at
        self._current: Tensor | None = None  # the scale of the step in progress
        self._upcoming: Tensor | None = None  # the scale read when the latest forward pass began
        self.searches = 0
        if scaler is not None:
            self.use(scaler)

    def use(self, scaler: Any) -> None:
        self.scaler = scaler
        self._states = getattr(scaler, "_per_optimizer_states", None)

    @property
    def active(self) -> bool:
        """A scaler is known and enabled."""
        scaler = self.scaler
        return scaler is not None and bool(scaler.is_enabled())

    def tensor(self) -> Tensor | None:
        """The current scale as a 0-d tensor on the scaler's device, without a host read."""
        if not self.active:
            return None
        scale = getattr(self.scaler, "_scale", None)
        if isinstance(scale, Tensor):
            return scale
        return torch.tensor(float(self.scaler.get_scale()))  # before the first scale(): the initial scale

    def value(self) -> float:
        """The current scale as a float (1.0 without an active scaler). On a GPU this reads the device."""
        scale = self.tensor()
        return 1.0 if scale is None else float(scale)

    def at_forward(self) -> bool:
        """A training forward pass begins: whether ``update()`` ran since the previous one began. Also notes the
        scale the coming step uses (``update()`` of the previous iteration has run by now)."""
        if not self.active:
            return False
        states = getattr(self.scaler, "_per_optimizer_states", None)
        ran = states is not self._states
        self._states = states
        scale = self.tensor()
        self._upcoming = scale.detach().clone() if scale is not None else None
        if self._current is None:
            self._current = self._upcoming
        return ran

    def scale_of_finished_step(self) -> Tensor | None:
        """The scale the step being committed used; the next step uses the one noted when its forward began."""
        scale, self._current = self._current, self._upcoming
        return scale

    def discover(self) -> bool:
        """Inside an owned optimizer's step: find the GradScaler that called it, if any (first steps only)."""
        if self.scaler is not None or self.searches >= DISCOVERY_STEPS:
            return False
        self.searches += 1
        frame: FrameType | None
        try:
            frame = sys._getframe(2)
        except ValueError:
            return False
        codes: frozenset[CodeType] | None = None  # gathered at the first frame of a method of one of their names
        for _ in range(_DISCOVERY_DEPTH):
            if frame is None:
                break
            # the code object first: reading a frame's locals would keep them alive (the user's frames included)
            code = frame.f_code
            if code.co_name in _STEP_NAMES and code in (codes := codes or _scaler_step_codes()):
                candidate: Any = frame.f_locals.get("self")
                if is_grad_scaler(candidate) and candidate.is_enabled():
                    self.use(candidate)
                    scale = self.tensor()
                    self._current = scale.detach().clone() if scale is not None else None  # in this step's grads
                    return True
            frame = frame.f_back
        return False

    def skips_before(self, first_scale: float | None) -> int:
        """How many times the scale was backed off since the run began at ``first_scale`` (the scaler's initial
        scale when None), as far as the scale alone tells: used when the scaler is found late."""
        scaler = self.scaler
        start = first_scale if first_scale is not None else float(getattr(scaler, "_init_scale", 0.0) or 0.0)
        now = self.value()
        backoff = float(scaler.get_backoff_factor())
        if not (start > 0 and now > 0 and 0 < backoff < 1) or now >= start:
            return 0
        return round(math.log(now / start) / math.log(backoff))
