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

Under a GradScaler it also counts the steps the scaler skipped and follows its scale (:class:`ScalerCounts`). A
skipped step is the scaler doing its job (the scaled gradients overflowed float16, the step is dropped and the
scale lowered), not a failure; a scale that keeps collapsing is: a run that cannot learn whatever its layers do,
like a degenerate loss (``FailureKind.LOSS_SCALE_COLLAPSE``, a run-level kind).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from torch import nn

from ..events import EventType, FailureKind, SemanticEvent
from ..stats.step import StepData

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


#: The trailing window the scale-collapse rule looks at: a default GradScaler (initial scale 2**16, backoff 0.5)
#: that skips every step falls to a scale of 1 within these 16 steps.
SCALE_WINDOW = 16
#: A scale the scaler backed off below this shrinks the loss instead of scaling it up: even unscaled, the float16
#: gradients overflowed (or were NaN, which no scale fixes). Healthy float16 runs keep scales of about 2**8 to 2**24.
SCALE_FLOOR = 1.0
#: Skipped steps whose numbers are kept to show (the count is exact).
_SHOWN_SKIPS = 20


@dataclass
class ScalerCounts:
    """What a GradScaler did over the observed steps: skips and its scale."""

    steps: int = 0  # observed steps under an active scaler
    skipped: int = 0
    first_skipped: list[int] = field(default_factory=list)  # the first step numbers skipped (at most 20)
    recent: deque[tuple[int, bool]] = field(default_factory=lambda: deque(maxlen=SCALE_WINDOW))
    applied: int = 0  # steps the optimizer took
    streak: int = 0  # skipped steps in a row, up to the last observed step
    streak_start: int = -1
    streak_end: int = -1
    streak_in_training: bool = False  # the streak began after the optimizer had taken a step
    collapse: tuple[int, int, int] | None = None  # (first, last, length) of the longest such streak, ended
    first_scale: tuple[int, float] | None = None
    last_scale: tuple[int, float] | None = None
    min_scale: tuple[int, float] | None = None
    below_floor: tuple[int, int] | None = None  # (first, last) step with a scale under SCALE_FLOOR

    def observe(self, record: StepData) -> None:
        step = record.step
        self.steps += 1
        self.recent.append((step, record.skipped))
        if record.skipped:
            self.skipped += 1
            if len(self.first_skipped) < _SHOWN_SKIPS:
                self.first_skipped.append(step)
            if self.streak == 0:
                self.streak_start = step
                self.streak_in_training = self.applied > 0
            self.streak += 1
            self.streak_end = step
        else:
            self._end_streak()
            self.applied += 1
        scale = record.loss_scale
        if scale is not None and math.isfinite(scale):
            self.first_scale = self.first_scale or (step, scale)
            self.last_scale = (step, scale)
            if self.min_scale is None or scale < self.min_scale[1]:
                self.min_scale = (step, scale)
            if scale < SCALE_FLOOR and scale < self.first_scale[1]:  # backed off there (not a scale set so low)
                self.below_floor = (self.below_floor[0] if self.below_floor else step, step)

    def _end_streak(self) -> None:
        longer = self.collapse is None or self.streak > self.collapse[2]
        if self.streak >= SCALE_WINDOW and self.streak_in_training and longer:
            self.collapse = (self.streak_start, self.streak_end, self.streak)
        self.streak = 0

    def facts(self) -> dict[str, float | int | list[int]]:
        """The counts as meta data (``dbg.meta["grad_scaler"]``)."""
        out: dict[str, float | int | list[int]] = {
            "steps": self.steps,
            "skipped_steps": self.skipped,
            "first_skipped_steps": list(self.first_skipped),
        }
        for key, value in (
            ("first_scale", self.first_scale),
            ("last_scale", self.last_scale),
            ("min_scale", self.min_scale),
        ):
            if value is not None:
                out[key] = value[1]
        return out

    def event(self, last: int) -> SemanticEvent | None:
        """The scale-collapse finding, or None: most of the last ``SCALE_WINDOW`` steps skipped (or all of a
        shorter run's, at least 3), a run of ``SCALE_WINDOW`` skips in a row after training had begun, or a scale
        under ``SCALE_FLOOR``."""
        window = list(self.recent)
        skipped_recent = [step for step, skipped in window if skipped]
        spans: list[tuple[int, int]] = []
        parts: list[str] = []
        if len(skipped_recent) >= max(3, (len(window) + 1) // 2):
            # from where the skipping began: the window's first skip, or the start of a streak reaching into it
            begun = min(skipped_recent[0], self.streak_start) if self.streak else skipped_recent[0]
            spans.append((begun, last))
            parts.append(f"{len(skipped_recent)} of the last {len(window)} steps skipped")
        longest = self.collapse
        if self.streak >= SCALE_WINDOW and self.streak_in_training and (longest is None or self.streak > longest[2]):
            longest = (self.streak_start, self.streak_end, self.streak)
        if longest is not None:
            spans.append((longest[0], longest[1]))
            parts.append(f"{longest[2]} steps in a row skipped (steps {longest[0]}-{longest[1]}) after training began")
        if self.below_floor is not None:
            spans.append(self.below_floor)
            parts.append(f"the scale backed off below {SCALE_FLOOR:g}")
        if not spans:
            return None
        metrics: dict[str, float] = {
            "skipped_steps": float(self.skipped),
            "steps": float(self.steps),
            "window_steps": float(len(window)),
            "skipped_in_window": float(len(skipped_recent)),
        }
        for key, value in (
            ("first_scale", self.first_scale),
            ("loss_scale", self.last_scale),
            ("min_scale", self.min_scale),
        ):
            if value is not None:
                metrics[key] = value[1]
        detail = "; ".join(parts)
        start = min(s for s, _ in spans)
        end = max(e for _, e in spans)
        return _event(FailureKind.LOSS_SCALE_COLLAPSE, start, end, detail, **metrics)


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
    scaler: ScalerCounts | None = None  # under a GradScaler: its skipped steps and scale

    def observe(self, record: StepData) -> None:
        """Count one analysed step."""
        self.steps += 1
        self.last_step = max(self.last_step, record.step)
        if record.loss is not None:
            self.last_loss = record.loss
        if record.skipped or record.loss_scale is not None:
            if self.scaler is None:
                self.scaler = ScalerCounts()
            self.scaler.observe(record)
        if record.skipped:  # the scaler dropped this step's gradients: no evidence about them either way
            return
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
        if self.scaler is not None:
            collapse = self.scaler.event(last)
            if collapse is not None:
                out.append(collapse)
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
