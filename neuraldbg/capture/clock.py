"""The step clock: what one *training step* is.

A step is one forward/backward cycle closed by the steps of the optimizers that own the model's parameters.
It is committed when the next training forward pass begins, so several optimizers stepping in one iteration,
or gradient accumulation over several micro-batches, make one step. ``optimizer.step(closure)`` runs the
forward and backward passes *inside* the step (LBFGS even several times): those forwards belong to the step the
closure serves, which is complete when the optimizer's step returns. A closure that runs no forward pass (the
do-nothing closure Lightning passes in manual optimisation) makes an ordinary step. Until an optimizer is
seen, each backward pass is provisionally a step; when an optimizer then steps, the provisional steps are
folded into one (they were micro-batches of gradient accumulation). If no optimizer ever steps, a step is one
backward pass. ``step()`` switches to manual counting.

Mixed precision: a GradScaler skips the optimizer step of an iteration whose scaled gradients overflowed. That
iteration is a step too (a *skipped* step), not a micro-batch of the next one: ``skip_probe`` (set when a scaler
is known, see :mod:`neuraldbg.capture.scaler`) says at each forward pass whether ``scaler.update()`` ran since
the previous one, which every iteration does once and gradient accumulation does not between micro-batches.
Without an optimizer step in between, that iteration was skipped.

The clock holds no tensors and decides nothing about statistics: :mod:`neuraldbg.capture` tells it what the
hooks saw, and it answers whether the step in progress is complete.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

#: Provisional (per-backward) steps held before concluding that no optimizer will step.
PROVISIONAL_LIMIT = 64


class StepMode(str, Enum):
    UNKNOWN = "unknown"  # no optimizer step seen yet; backward passes are provisional steps
    OPTIMIZER = "optimizer"
    BACKWARD = "backward"
    MANUAL = "manual"


class StepClock:
    """Step boundaries from the sequence of forward passes, backward passes and optimizer steps."""

    def __init__(self) -> None:
        self.mode = StepMode.UNKNOWN
        self.step = 0  # the step in progress
        self.provisional = 0  # provisional steps committed while the mode is unknown
        self.backward = False  # a backward pass ran in the step in progress
        self.stepped = False  # an optimizer stepped in the step in progress
        self.in_closure = False  # inside ``optimizer.step(closure)``: its forwards belong to this step
        self.closure_forward = False  # a forward pass ran inside the closure in progress
        self.optimizer_steps = 0  # every owned optimizer step seen (several per step with several optimizers)
        self.backward_passes = 0  # backward passes seen (only where the loss gradient is hooked, see capture)
        self.skip_probe: Callable[[], bool] | None = None  # did scaler.update() run since the last forward pass?
        self.skipped = False  # the step in progress was skipped by the GradScaler (commit it as such)
        self.fold_first = False  # fold the provisional steps into the step in progress before committing it

    def forward_begins(self) -> bool:
        """A training forward pass begins: True when the step in progress is complete (commit it first)."""
        if self.in_closure:  # the closure's first forward begins the step the closure serves
            first, self.closure_forward = not self.closure_forward, True
            return first and self.stepped
        update_ran = self.skip_probe is not None and self.skip_probe()  # asked every time: it tracks changes
        if self.mode is StepMode.OPTIMIZER:
            return self.stepped or (self.backward and update_ran and self._skip())
        if self.mode is StepMode.MANUAL or not self.backward:
            return False
        if update_ran and self.mode is StepMode.UNKNOWN:  # an optimizer exists: the scaler skipped its step
            return self._skip()
        if self.mode is StepMode.UNKNOWN:
            self.provisional += 1
            if self.provisional >= PROVISIONAL_LIMIT:
                self.mode = StepMode.BACKWARD
        return True

    def backward_begins(self) -> None:
        self.backward = True
        self.backward_passes += 1

    def _skip(self) -> bool:
        """The step in progress ran its backward pass and the GradScaler skipped its optimizer step."""
        if self.mode is StepMode.UNKNOWN:  # earlier backward passes were micro-batches of this skipped step
            self.mode = StepMode.OPTIMIZER
            self.fold_first = self.provisional > 0
        self.skipped = True
        return True

    def skipped_in_step(self) -> None:
        """The optimizer was called but told by the GradScaler to skip the update (a fused optimizer)."""
        self.skipped = True

    def adopt_skips(self) -> None:
        """A GradScaler was found at the first optimizer step and says the provisional steps before it were each an
        iteration it skipped (not micro-batches to fold): they stay steps of their own (the recorder marks them)."""
        self.provisional = 0

    def optimizer_begins(self, closure: bool) -> bool:
        """An owned optimizer's step begins; True when the provisional steps must be folded into one first.
        With a closure, the step's forward and backward passes may still be to come."""
        fold = self.mode is StepMode.UNKNOWN
        if fold:
            self.mode = StepMode.OPTIMIZER
        self.optimizer_steps += 1
        if closure and not self.in_closure:
            self.in_closure = True
            self.closure_forward = False
        elif not closure:
            self.stepped = True
        return fold

    def optimizer_ends(self) -> bool:
        """An optimizer's step returned; True when it was a closure step (now complete)."""
        if not self.in_closure:
            return False
        self.in_closure = False
        self.stepped = True
        return True

    def next_index(self) -> int:
        """The index of the step the next forward pass will belong to."""
        return self.step + 1 if self.stepped else self.step

    def manual(self) -> bool:
        """``step()`` was called; True when the provisional steps must be folded first."""
        fold = self.mode is not StepMode.MANUAL
        self.mode = StepMode.MANUAL
        return fold

    def finish(self, anything_recorded: bool) -> bool:
        """The run ends: True when the step in progress is a step to commit (a backward pass or an optimizer
        step happened in it; in manual mode, anything recorded). Forward passes alone are not a training step.
        An unknown mode becomes "backward": no optimizer ever stepped."""
        commit = self.backward or self.stepped or (anything_recorded and self.mode is StepMode.MANUAL)
        if (
            self.backward
            and not self.stepped
            and self.mode in (StepMode.OPTIMIZER, StepMode.UNKNOWN)
            and self.skip_probe is not None
            and self.skip_probe()
        ):
            self._skip()  # the last iteration was skipped by the GradScaler
        if self.mode is StepMode.UNKNOWN and (commit or self.provisional):
            self.mode = StepMode.BACKWARD
        return commit

    def committed(self) -> None:
        """The step in progress was committed; the next one begins."""
        self.step += 1
        self.backward = False
        self.stepped = False
        self.skipped = False
        self.fold_first = False

    def folded(self, first: int) -> None:
        """Provisional steps from ``first`` on were folded into one step in progress."""
        self.step = first
        self.provisional = 0
