"""Evidence that a run was observed at all: a verdict of "healthy" needs it.

The hooks count what they saw (forward passes of the model in and out of training, backward passes, forwards in
eval mode, the debugger's own failures and what it had to skip); the analysis counts, per observed step, whether a
gradient reached the parameters and whether the loss gave any. From those, :meth:`Coverage.events` states the
run-level findings (``EventType.RUN`` events, kinds in :data:`~neuraldbg.events.RUN_LEVEL_KINDS`):

* no training step observed (an empty loader, validation only, another model object trained);
* no gradient ever reached a trainable parameter although steps were taken (``loss.backward()`` forgotten, or
  the loss detached from the graph): every full step carried no gradient;
* the model trained in eval mode while it has layers that behave differently in training (dropout, batch norm);
* a degenerate loss: backward passes ran, but the gradient of the loss w.r.t. the model's output and every
  parameter gradient were exactly zero on every fully observed step (``cross_entropy`` on one output unit);
* an incomplete observation: the debugger stopped observing (its own failure, a warning), skipped parameters it
  cannot read, or never saw a forward pass of the model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from torch import nn

from .events import EventType, FailureKind, SemanticEvent
from .stepdata import StepData

#: Layers whose computation differs between ``train()`` and ``eval()``.
_MODE_DEPENDENT: tuple[type[nn.Module], ...] = (
    nn.modules.dropout._DropoutNd,
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
)


def mode_dependent_layers(named: Iterable[tuple[str, nn.Module]]) -> list[str]:
    """'name' (Type) of every module whose forward depends on ``module.training``: dropout, batch norm with
    running statistics, recurrent layers and attention with a dropout probability."""
    found = []
    for name, module in named:
        depends = isinstance(module, _MODE_DEPENDENT) and (
            not isinstance(module, nn.modules.batchnorm._NormBase) or module.track_running_stats
        )
        if isinstance(module, (nn.RNNBase, nn.MultiheadAttention)) and float(getattr(module, "dropout", 0.0)) > 0:
            depends = True
        if depends and name:
            found.append(f"'{name}' ({type(module).__name__})")
    return found


@dataclass
class Coverage:
    """What was observed of a run; see the module docstring."""

    mode_dependent: list[str] = field(default_factory=list)
    # counted by the hooks
    forwards: int = 0  # training forward passes (gradients enabled, training thread), compiled ones included
    no_grad_forwards: int = 0  # forwards of the model under no_grad / inference_mode
    other_thread_forwards: int = 0  # forwards of the model from another thread (never recorded)
    eval_forwards: int = 0  # eval-mode forwards not followed by a backward pass (validation)
    eval_steps: list[int] = field(default_factory=list)  # steps trained with the model in eval mode
    failures: list[tuple[int, str]] = field(default_factory=list)  # (step, what failed) of the debugger itself
    skipped: dict[str, str] = field(default_factory=dict)  # parameter -> why its gradient could not be read
    first_skip: int = -1
    # counted by the analysis
    steps: int = 0
    full_steps: int = 0
    steps_with_gradient: int = 0  # a parameter gradient was present
    steps_with_nonzero_gradient: int = 0  # ... and not exactly zero everywhere
    loss_gradient_readings: int = 0  # full steps where the loss gradient w.r.t. the output was read
    zero_loss_gradient: int = 0  # ... and it was exactly zero
    last_loss: float | None = None
    last_step: int = -1

    def observe(self, record: StepData) -> None:
        """Count one analysed step."""
        self.steps += 1
        self.last_step = max(self.last_step, record.step)
        if record.loss is not None:
            self.last_loss = record.loss
        if record.full:
            self.full_steps += 1
            if record.grad:
                self.steps_with_gradient += 1
                if any(v != 0.0 for v in record.grad.values()):
                    self.steps_with_nonzero_gradient += 1
            if record.target_grad is not None:
                self.loss_gradient_readings += 1
                self.zero_loss_gradient += record.target_grad == 0.0
        elif record.head_finite is not None:  # a cheap step read one element of the head layer's gradient
            self.steps_with_gradient += 1
            self.steps_with_nonzero_gradient += 1

    def failed(self, step: int, what: str) -> None:
        self.failures.append((step, what))

    def skip(self, step: int, names: Iterable[str], why: str) -> None:
        for name in names:
            if name not in self.skipped:
                self.skipped[name] = why
                if self.first_skip < 0:
                    self.first_skip = step

    def events(self, trainable: int, backward_passes: int, optimizer_steps: int) -> list[SemanticEvent]:
        """The run-level findings so far (see the module docstring)."""
        last = max(self.last_step, 0)
        out = []
        if self.steps == 0 and not self.failures:  # a debugger that failed says so below, not "no training"
            out.append(
                _event(
                    FailureKind.NO_TRAINING_OBSERVED,
                    0,
                    0,
                    forwards=self.forwards,
                    no_grad_forwards=self.no_grad_forwards,
                    eval_forwards=self.eval_forwards,
                    other_thread_forwards=self.other_thread_forwards,
                )
            )
        elif self.full_steps and self.steps_with_gradient == 0 and trainable:
            out.append(
                _event(
                    FailureKind.NO_GRADIENT,
                    0,
                    last,
                    steps=self.steps,
                    trainable_parameters=trainable,
                    backward_passes=backward_passes,
                    optimizer_steps=optimizer_steps,
                )
            )
        elif (
            self.steps_with_gradient
            and self.steps_with_nonzero_gradient == 0
            and self.loss_gradient_readings
            and self.zero_loss_gradient == self.loss_gradient_readings
        ):
            metrics = {"steps": float(self.steps)}
            if self.last_loss is not None and math.isfinite(self.last_loss):
                metrics["loss"] = self.last_loss
            out.append(_event(FailureKind.DEGENERATE_LOSS, 0, last, "", **metrics))
        if self.eval_steps and self.mode_dependent:
            out.append(
                _event(
                    FailureKind.EVAL_MODE_TRAINING,
                    self.eval_steps[0],
                    max(self.eval_steps[-1], self.eval_steps[0]),
                    ", ".join(self.mode_dependent),
                    steps=len(self.eval_steps),
                    mode_dependent_layers=len(self.mode_dependent),
                )
            )
        out.extend(self._incomplete(last))
        return out

    def _incomplete(self, last: int) -> list[SemanticEvent]:
        parts: list[str] = []
        start = last + 1
        if self.failures:
            step, what = self.failures[0]
            parts.append(what)
            start = min(start, step)
        if self.skipped:
            names = sorted(self.skipped)
            shown = ", ".join(f"'{n}'" for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            parts.append(f"the gradients of {shown} could not be read ({self.skipped[names[0]]})")
            start = min(start, self.first_skip)
        if self.steps and self.forwards == 0:
            parts.append(
                "no forward pass of the watched model was seen (was it called through a copy, torch.func, or "
                "another object?): only gradients and updates were checked"
            )
            start = 0
        if not parts:
            return []
        start = max(0, start)  # may lie past the last observed step: the first step that was not observed
        metrics = {"step": float(start)}
        if self.skipped:
            metrics["skipped_parameters"] = float(len(self.skipped))
        return [_event(FailureKind.INCOMPLETE_OBSERVATION, start, max(last, start), "; ".join(parts), **metrics)]


def _event(kind: FailureKind, start: int, end: int, detail: str = "", /, **metrics: float) -> SemanticEvent:
    return SemanticEvent(
        event_type=EventType.RUN,
        kind=kind,
        layer="",
        param=None,
        step_start=start,
        step_end=max(start, end),
        from_state=None,
        to_state=kind.value,
        metrics={k: float(v) for k, v in metrics.items()},
        confidence=1.0,
        detail=detail,
    )
