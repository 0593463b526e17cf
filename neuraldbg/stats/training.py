"""What the fully observed steps say about how a run trains, for the findings about its loss.

:class:`TrainingFacts` keeps, for at most :data:`ROWS` fully observed steps evenly spread over the run, the numbers
an explanation of a loss that does not fall ranks its causes by: the update/weight ratio ||dW||/||W|| of the whole
model (the learning rate's footprint; over all parameters together, so that a tiny parameter such as a layer
scale initialised to 1e-6 does not speak for the model), the weights' total norm (weight decay shrinks it), the
gradients' total norm, how much clipping shrank the gradients, the norm of the weights that weight decay applies
to (when some groups of the optimizer decay and others do not), the input batch's root-mean-square (pixels in
0-255 give ~100; at most the scale at which the data entered the layers with parameters, when that was read: a
model that divides its input by 255 in its forward sees 0-1 pixels) and the learning rate; and the model output's
last dimension (a classifier's classes). Host floats only; nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .step import StepData

#: Fully observed steps kept (evenly spread: when full, every other row is dropped and rows are taken half as often).
ROWS = 128


@dataclass(frozen=True, slots=True)
class Row:
    step: int
    update_ratio: float  # ||dW|| / ||W|| over all the parameters measured (NaN: not measured)
    weight_norm: float  # sqrt of the sum of the parameters' squared norms after the step (NaN: not measured)
    grad_norm: float  # the total gradient norm the optimizer received (NaN: not read)
    clip: float  # how many times smaller clipping made the gradients (1: no clipping seen)
    input_rms: float  # NaN: no floating input
    lr: float  # the largest learning rate that stepped the model (NaN: none)
    finite: bool  # every gradient finite
    decayed_norm: float = math.nan  # the weights' norm over the parameters of the groups that decay (NaN: all or none)


class TrainingFacts:
    """See the module docstring."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self._stride = 1
        self._offered = 0
        self.classes = 0  # the last dimension of the model's (logit) output, when it has one
        self.probabilities: bool | None = None  # one output unit that was always in [0, 1] (None: not read)
        self.nonfinite_gradient_steps = 0
        # the largest scale of the data where it entered the layers with parameters, over the steps that read it
        # (see StepData.entry_scale; None: never read)
        self.entry_scale: float | None = None

    def observe(self, record: StepData) -> None:
        """Take in a fully observed step that was not skipped."""
        if record.classes:
            self.classes = record.classes
        if record.probabilities is not None:
            self.probabilities = record.probabilities and self.probabilities is not False
        entry = record.entry_scale
        if entry is not None and math.isfinite(entry):
            self.entry_scale = entry if self.entry_scale is None else max(self.entry_scale, entry)
        finite = all(math.isfinite(v) for v in record.grad.values()) and not record.grad_nonfinite
        self.nonfinite_gradient_steps += not finite
        offered, self._offered = self._offered, self._offered + 1
        if offered % self._stride:
            return
        moved = [(d, w) for d, w in record.update.values() if math.isfinite(d) and math.isfinite(w)]
        weight = math.sqrt(sum(w * w for _, w in moved)) if moved else math.nan
        delta = math.sqrt(sum(d * d for d, _ in moved)) if moved else math.nan
        grads = [g for g in record.grad.values() if math.isfinite(g)]
        decayed = record.decayed
        kept = [w for name, (d, w) in record.update.items() if decayed and name in decayed and math.isfinite(w)]
        rms = input_rms(record, self.entry_scale)
        self.rows.append(
            Row(
                step=record.step,
                update_ratio=delta / weight if weight > 0 else math.nan,
                weight_norm=weight,
                grad_norm=math.sqrt(sum(g * g for g in grads)) if grads else math.nan,
                clip=record.grad_clip_factor or 1.0,
                input_rms=rms,
                lr=max(record.stepped.values()) if record.stepped else math.nan,
                finite=finite,
                decayed_norm=math.sqrt(sum(w * w for w in kept)) if kept else math.nan,
            )
        )
        if len(self.rows) >= ROWS:
            self.rows = self.rows[::2]
            self._stride *= 2

    def between(self, start: float, end: float) -> tuple[int, int]:
        """The indices ``a:b`` of the rows whose steps lie between the fractions ``start`` and ``end`` of the steps
        the rows span, at least one row. By steps, not by rows: fully observed steps are dense at the start of a run
        (every step of the first 16, then every 16th), so the first quarter of the rows of a 300-step run is its
        first 8 steps."""
        rows = self.rows
        if not rows:
            return 0, 0
        first, last = rows[0].step, rows[-1].step
        low, high = first + start * (last - first), first + end * (last - first)
        a = next((i for i, r in enumerate(rows) if r.step >= low), len(rows) - 1)
        b = next((i for i, r in enumerate(rows) if r.step > high), len(rows))
        return a, max(b, a + 1)

    def median(self, field: str, start: float = 0.0, end: float = 1.0) -> float:
        """The median of a field over the steps between the fractions ``start`` and ``end`` of the run (see
        :meth:`quantile`)."""
        return self.quantile(field, 0.5, start, end)

    def quantile(self, field: str, q: float, start: float = 0.0, end: float = 1.0) -> float:
        """The ``q`` quantile of a field over the steps between the fractions ``start`` and ``end`` of the run: the
        rows of :meth:`between`, each standing for the steps until the next row (a fully observed step stands for
        the cheap ones after it); NaN values left out; NaN when none is left. At an even split of the weight, the
        mean of the two values beside it (for ``q`` = 0.5 and equal weights: ``statistics.median``)."""
        a, b = self.between(start, end)
        rows = self.rows
        weighted: list[tuple[float, int]] = []
        for i in range(a, b):
            value: float = getattr(rows[i], field)
            if math.isfinite(value):
                weighted.append((value, rows[i + 1].step - rows[i].step if i + 1 < len(rows) else 1))
        if not weighted:
            return math.nan
        weighted.sort()
        cut, seen = q * sum(w for _, w in weighted), 0
        for i, (value, w) in enumerate(weighted):
            seen += w
            if seen > cut:
                return value
            if seen == cut and i + 1 < len(weighted):
                return (value + weighted[i + 1][0]) / 2
        return weighted[-1][0]


def input_rms(record: StepData, entry_scale: float | None) -> float:
    """The root-mean-square of a step's input batch (NaN: no floating input): the largest of its data arguments',
    capped by ``entry_scale``, the scale at which the data entered the first layers with parameters (data rescaled
    in the model's forward before any layer with parameters met it)."""
    rms = math.nan
    if record.input_norm is not None and record.input_numel:
        rms = record.input_norm / math.sqrt(record.input_numel)
    scale = record.input_scale
    if scale is not None and math.isfinite(scale) and scale > 0 and not rms >= scale:
        rms = scale  # data arguments after the first one, larger
    if entry_scale is not None and rms > entry_scale:
        rms = entry_scale
    return rms
