"""One step being collected: host fields, plus device tensors moved to the host at the next flush.

:class:`Pending` holds the step in progress (a :class:`~neuraldbg.stats.step.StepData` and the device tensors that
still have to be filed into it: 0-d tensors of one reading each, and 1-d tensors of many readings, one per element);
:func:`assign` files a flushed value into its field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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
        "grad_checks",
        "output_dead_pulled",
    }
)


Entry = tuple[str, Any, float]  # (target, key, extra): where a reading is filed (see :func:`assign`)


class Pending:
    """One step being collected: host fields, plus device tensors to move in the next flush."""

    __slots__ = ("captured", "data", "lost", "restart", "targets", "tensors", "terms", "vectors", "vtargets")

    def __init__(self, step: int, full: bool) -> None:
        self.data = StepData(step, full)
        self.tensors: list[Tensor] = []
        self.targets: list[Entry] = []
        self.vectors: list[Tensor] = []  # 1-d tensors of readings, filed after the 0-d ones, in order
        self.vtargets: list[Sequence[Entry]] = []  # ... each with the entry of each of its elements
        self.captured: Tensor | None = None  # the loss whose gradient is in .grad (see capture.ledger)
        self.lost = False  # a backward pass of that gradient started from something that is not a loss
        self.restart = False  # a backward pass of this part found the gradients reset: earlier parts do not count
        self.terms = 0  # the backward passes' losses added up in ``captured``

    def capture(self, loss: Tensor | None, restart: bool, keep_first: bool = False) -> None:
        """A backward pass that reached the model started from ``loss`` (None: not a loss). ``restart``: it found
        the gradients reset (or as the last optimizer step left them), so its loss begins the sum; otherwise it
        adds to it. ``keep_first``: inside ``optimizer.step(closure)``, a later evaluation does not replace the
        first (the loss at the parameters the step started from)."""
        if restart:
            if keep_first and (self.captured is not None or self.lost):
                return
            self.captured, self.lost, self.restart, self.terms = loss, loss is None, True, 1
        elif loss is None or self.lost:
            self.captured, self.lost = None, True
        else:
            self.captured = loss if self.captured is None else self.captured + loss
            self.terms += 1

    def put(self, target: str, key: Any, tensor: Tensor, extra: float = 0) -> None:
        self.targets.append((target, key, extra))
        self.tensors.append(tensor)

    def put_vector(self, entries: Sequence[Entry], values: Tensor | Sequence[Tensor]) -> None:
        """File ``values[i]`` as ``entries[i]``: a 1-d tensor (one transfer with the rest at the flush) or, for
        readings on several devices, 0-d tensors (see :func:`~neuraldbg.stats.tensors.norm_readings`)."""
        if isinstance(values, Tensor):
            if entries:
                self.vtargets.append(entries)
                self.vectors.append(values)
        else:
            self.targets.extend(entries)
            self.tensors.extend(values)

    @property
    def recorded(self) -> bool:
        """Whether any device reading was filed."""
        return bool(self.tensors or self.vectors)

    def file(self, scalars: Sequence[float], vectors: Sequence[float]) -> None:
        """File the host values of :attr:`tensors`, then of the elements of :attr:`vectors`, in order."""
        data = self.data
        for (target, key, extra), value in zip(self.targets, scalars):
            _ASSIGN[target](data, key, extra, value)
        i = 0
        for entries in self.vtargets:
            listed = _LISTED.get(entries[0][0])
            if listed is not None:  # one value per sample: the whole vector goes to the step's list at once
                getattr(data, listed).extend(vectors[i : i + len(entries)])
            else:
                for (target, key, extra), value in zip(entries, vectors[i : i + len(entries)]):
                    _ASSIGN[target](data, key, extra, value)
            i += len(entries)

    def read_now(self) -> None:
        """Read every device tensor of this step to the host now and file it (see :meth:`file`), letting go of the
        tensors: what a committed CPU step does, where a read costs no device sync (see
        :meth:`~neuraldbg.capture.recorder.Recorder.commit`)."""
        if self.tensors or self.vectors:  # a few tensors: read one by one, cheaper than stacking them first
            values = [float(t) for t in self.tensors]
            self.file(values, [x for v in self.vectors for x in (v if v.is_floating_point() else v.double()).tolist()])
        self.tensors, self.targets, self.vectors, self.vtargets = [], [], [], []
        self.captured = None

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
        # the readings of a vector are kept or dropped together (and divided together by unscale): a vector
        # mixes only targets these two treat alike, the first stands for all
        vkept = [(entries, v) for entries, v in zip(self.vtargets, self.vectors) if entries[0][0] not in _SCALED]
        self.vtargets = [entries for entries, _ in vkept]
        self.vectors = [v for _, v in vkept]
        if data.target_grad is not None and not math.isnan(data.target_grad):
            data.target_grad = None
        data.target_grad_sum = None
        readings_of_step = (data.grad, data.grad_numel, data.out_grad, data.func_dead, data.update, data.update_parts)
        for readings in (*readings_of_step, data.update_before):
            readings.clear()
        data.grad_exact_zero.clear()
        data.grad_nonfinite.clear()
        data.grad_before_clip.clear()
        data.stepped.clear()
        data.head_grad = data.head_finite = data.grad_clip_factor = None

    def unscale(self, scale: Tensor) -> None:
        """Divide a GradScaler's scale out of the loss and output gradients read so far (a scaler found only at
        the step's optimizer step, after its backward pass was read)."""
        self.tensors = [
            t / scale if target[0] in ("target_grad", "target_grad_sum", "out_grad", "captured_loss") else t
            for target, t in zip(self.targets, self.tensors)
        ]
        self.vectors = [
            v / scale if entries[0][0] in ("target_grad", "target_grad_sum", "out_grad", "captured_loss") else v
            for entries, v in zip(self.vtargets, self.vectors)
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
        self.vectors.extend(other.vectors)
        self.vtargets.extend(other.vtargets)
        if other.restart:
            self.captured, self.lost, self.restart, self.terms = other.captured, other.lost, True, other.terms
        elif other.lost or self.lost:
            self.captured, self.lost = None, self.lost or other.lost
        elif other.captured is not None:
            self.captured = other.captured if self.captured is None else self.captured + other.captured
            self.terms += other.terms
        src, dst = other.data, self.data
        dst.classes = src.classes or dst.classes
        if src.probabilities is not None:
            dst.probabilities = (
                src.probabilities if dst.probabilities is None else dst.probabilities and src.probabilities
            )
        dst.regression_target = src.regression_target or dst.regression_target
        dst.target_range = src.target_range or dst.target_range
        dst.label_prior = src.label_prior or dst.label_prior
        dst.label_classes = src.label_classes or dst.label_classes
        dst.label_steps.extend(src.label_steps)
        dst.input_range.extend(src.input_range)
        dst.target_baseline = src.target_baseline or dst.target_baseline
        dst.baseline_kind = src.baseline_kind or dst.baseline_kind
        if src.labels_ahead is not None:
            dst.labels_ahead = merge_max(dst.labels_ahead, src.labels_ahead)
        if src.next_token is not None:
            dst.next_token = merge_max(dst.next_token, src.next_token)
        if src.scored_padding is not None:
            dst.scored_padding = merge_max(dst.scored_padding, src.scored_padding)
        for source, value in src.inverted_masks.items():
            _mask_inverted(dst, source, 0.0, value)
        dst.samples.extend(src.samples)
        dst.sample_losses.extend(src.sample_losses)
        dst.sample_hits.extend(src.sample_hits)
        if src.log_prob_gap is not None:
            dst.log_prob_gap = merge_max(dst.log_prob_gap, src.log_prob_gap)
        if src.clamped_outside is not None:
            dst.clamped_outside = merge_max(dst.clamped_outside, src.clamped_outside)
        if src.loss_options is not None:
            dst.loss_options = merge_max(dst.loss_options, src.loss_options)
        if src.softmax_positives is not None:
            dst.softmax_positives = merge_max(dst.softmax_positives, src.softmax_positives)
        if src.graph_dropout is not None:
            dst.graph_dropout = merge_max(dst.graph_dropout, src.graph_dropout)
        dst.carried = src.carried or dst.carried
        dst.decayed = src.decayed or dst.decayed
        dst.carried_by = src.carried_by or dst.carried_by
        if src.grad_carried is not None:
            dst.grad_carried = merge_max(dst.grad_carried, src.grad_carried)
        dst.numel.update(src.numel)
        dst.input_numel = src.input_numel or dst.input_numel
        if src.input_scale is not None:
            dst.input_scale = merge_max(dst.input_scale, src.input_scale)
        if src.entry_scale is not None:
            dst.entry_scale = merge_max(dst.entry_scale, src.entry_scale)
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
    """File one flushed reading into its field (``extra``: what the reading is counted over, or a sample's scale)."""
    _ASSIGN[target](data, key, extra, value)


def _act(data: StepData, key: Any, extra: float, value: float) -> None:
    old = data.act.get(key)
    data.act[key] = value if old is None else merge_max(old, value)


def _largest(field: str) -> Callable[[StepData, Any, float, float], None]:
    """The filing of a reading kept as the largest of the step's (``merge_max``: a NaN wins)."""

    def assign(data: StepData, key: Any, extra: float, value: float) -> None:
        setattr(data, field, merge_max(getattr(data, field), value))

    return assign


def _input_range(data: StepData, key: Any, extra: float, value: float) -> None:
    """One element of the profile of a pass's data against a bounded source's range (``extra``: its index; 0
    begins a new profile: a step may give the model several batches of data)."""
    if extra == 0:
        data.input_range.append([])
    data.input_range[-1].append(value)


def _label_step(data: StepData, key: Any, extra: float, value: float) -> None:
    """One element of a step's label mix (``key``: the step it describes; ``extra``: the element's index)."""
    if extra == 0:
        data.label_steps.append([float(key)])
    data.label_steps[-1].append(value)


def _profile(field: str) -> Callable[[StepData, Any, float, float], None]:
    """The filing of one element of a profile read as a vector (``extra``: its index; 0 begins the profile, so a later
    reading of the step replaces an earlier one): a regression target's, a bounded output's targets', the labels',
    a loss's chance level from its targets."""

    def assign(data: StepData, key: Any, extra: float, value: float) -> None:
        if extra == 0:
            setattr(data, field, [])
        getattr(data, field).append(value)

    return assign


def _arguments_nan(data: StepData, key: Any, extra: float, value: float) -> None:
    if math.isnan(value):  # a NaN among the call's other arguments: the data is bad (see stats.nan_flag)
        data.input_norm = math.nan


def _target_grad(data: StepData, key: Any, extra: float, value: float) -> None:
    if data.skipped and not math.isnan(value):
        return  # a skipped step's scaled loss gradient overflowed: not the loss's
    data.target_grad = merge_max(data.target_grad, value)


def _target_grad_sum(data: StepData, key: Any, extra: float, value: float) -> None:
    if not data.skipped:
        data.target_grad_sum = merge_max(data.target_grad_sum, value)


def _loss(data: StepData, key: Any, extra: float, value: float) -> None:
    data.loss = value
    data.loss_observed = True


def _captured_loss(data: StepData, key: Any, extra: float, value: float) -> None:
    data.loss = value


def _mask_inverted(data: StepData, key: Any, extra: float, value: float) -> None:
    data.inverted_masks[key] = max(value, data.inverted_masks.get(key, 0.0))


def _padded(data: StepData, key: Any, extra: float, value: float) -> None:
    data.padded = value > 0 or bool(data.padded)


def _probabilities(data: StepData, key: Any, extra: float, value: float) -> None:
    data.probabilities = value > 0 if data.probabilities is None else data.probabilities and value > 0


def _loss_scale(data: StepData, key: Any, extra: float, value: float) -> None:
    data.loss_scale = value


def _dead(data: StepData, key: Any, extra: float, value: float) -> None:
    data.dead[key] = (value, int(extra))


def _output_dead_pulled(data: StepData, key: Any, extra: float, value: float) -> None:
    data.output_dead_pulled = (value, int(extra))


def _func_dead(data: StepData, key: Any, extra: float, value: float) -> None:
    data.func_dead[key] = (value, int(extra))


def _saturated(data: StepData, key: Any, extra: float, value: float) -> None:
    data.saturated[key] = (value, int(extra))


def _numel(data: StepData, key: Any, extra: float, value: float) -> None:  # a compiled step's output size
    data.numel[key] = int(value)


def _output_numel(data: StepData, key: Any, extra: float, value: float) -> None:
    data.output_numel = int(value)


def _input_numel(data: StepData, key: Any, extra: float, value: float) -> None:
    data.input_numel = int(value)


def _units(data: StepData, key: Any, extra: float, value: float) -> None:
    # a compiled step's unit count, filed right after its dead or saturated count
    counts = data.dead if key in data.dead else data.saturated
    if key in counts:
        counts[key] = (counts[key][0], int(value))


def _grad_check(data: StepData, key: Any, extra: float, value: float) -> None:
    # a cheap step's largest gradient element: filed only when it is inf or NaN
    if not math.isfinite(value) and not data.skipped:
        data.grad[key] = value
        data.grad_numel[key] = int(extra)
        data.grad_nonfinite.add(key)


def _grad_checks(data: StepData, key: Any, extra: float, value: float) -> None:
    # the sum of a device step's gradient probes; ``key``: (name, element count) of each gradient, and its probe.
    # Only when the sum is not finite are the probes read (a second transfer, at the flush, in that step alone)
    if math.isfinite(value) or data.skipped:
        return
    checked, probes = key
    for (name, numel), probe in zip(checked, stats.to_host(probes)):
        _grad_check(data, name, numel, probe)


def _out_grad(data: StepData, key: Any, extra: float, value: float) -> None:
    old = data.out_grad.get(key)
    data.out_grad[key] = value if old is None else merge_max(old, value)


def _delta(data: StepData, key: Any, extra: float, value: float) -> None:
    # one snapshot reading: delta, weight, then before; ``extra`` is the sample's scale (1 when the parameter was
    # copied whole)
    data.update_parts[key] = [value, extra]


def _weight(data: StepData, key: Any, extra: float, value: float) -> None:
    data.update_parts[key].append(value)


def _before(data: StepData, key: Any, extra: float, value: float) -> None:
    delta, scale, after = data.update_parts.pop(key)
    data.update[key] = (stats.update_norm(delta, scale, after, value), after)
    data.update_before[key] = value


#: Vectors of one value per sample, filed whole into the step's list of that name.
_LISTED = {"sample": "samples", "sample_loss": "sample_losses", "sample_hit": "sample_hits"}

_ASSIGN: dict[str, Callable[[StepData, Any, float, float], None]] = {
    "act": _act,
    "input": _largest("input_norm"),
    "arguments_nan": _arguments_nan,
    "output": _largest("output_norm"),
    "target_grad": _target_grad,
    "target_grad_sum": _target_grad_sum,
    "loss": _loss,
    "captured_loss": _captured_loss,
    "probabilities": _probabilities,
    "regression_target": _profile("regression_target"),
    "labels_ahead": _largest("labels_ahead"),
    "next_token": _largest("next_token"),
    "scored_padding": _largest("scored_padding"),
    "input_scale": _largest("input_scale"),
    "entry_scale": _largest("entry_scale"),
    "log_prob_gap": _largest("log_prob_gap"),
    "clamped_outside": _largest("clamped_outside"),
    "loss_options": _largest("loss_options"),
    "softmax_positives": _largest("softmax_positives"),
    "graph_dropout": _largest("graph_dropout"),
    "target_range": _profile("target_range"),
    "label_prior": _profile("label_prior"),
    "label_step": _label_step,
    "input_range": _input_range,
    "target_baseline": _profile("target_baseline"),
    "padded": _padded,
    "mask_inverted": _mask_inverted,
    "carried": _largest("grad_carried"),
    "grad_left": _largest("grad_left"),
    "grad_kept": _largest("grad_kept"),
    "loss_scale": _loss_scale,
    "dead": _dead,
    "output_dead_pulled": _output_dead_pulled,
    "func_dead": _func_dead,
    "saturated": _saturated,
    "numel": _numel,
    "output_numel": _output_numel,
    "input_numel": _input_numel,
    "units": _units,
    "grad_check": _grad_check,
    "grad_checks": _grad_checks,
    "out_grad": _out_grad,
    "delta": _delta,
    "weight": _weight,
    "before": _before,
}
