"""What a fully observed step computes, on device: per-layer output statistics, gradient statistics, updates.

Functions here turn tensors into 0-d device tensors filed into a :class:`~neuraldbg.stats.step.Pending` step
(moved to the host in one transfer at the flush), plus the few host readings that need a sync only in rare cases
(a gradient norm of exactly 0 or inf, to tell underflow from a true zero). :mod:`neuraldbg.capture` decides when
they run; :mod:`neuraldbg.stats.tensors` holds the reductions themselves.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import DebugConfig
from ..model.info import LayerInfo, Role
from ..model.shards import Param
from ..stats import tensors as stats
from ..stats.step import SlotKey, StepData
from .pending import Entry, Pending


@dataclass(frozen=True)
class LayerSpec:
    """What the statistics of one layer's output need to know, fixed when the debugger attaches."""

    role: Role
    center: float = 0.0  # saturation bound of a bounded activation
    radius: float = 0.0
    channel_first: bool = False  # units along dim 1 (conv maps) rather than the last dim
    unit_layer: bool = False  # a Linear/Conv/norm layer whose output units may be activated functionally


def spec_of(info: LayerInfo) -> LayerSpec:
    bound = info.bound
    return LayerSpec(
        role=info.role,
        center=bound.center if bound is not None else 0.0,
        radius=bound.radius if bound is not None else 0.0,
        channel_first=info.channel_first,
        unit_layer=info.unit_weight is not None,
    )


def layer_output(
    pending: Pending, key: SlotKey, spec: LayerSpec, t: Tensor, channel_first: bool, config: DebugConfig
) -> None:
    """Per-unit activity of a ReLU-family output, or saturation of a bounded one."""
    if spec.role is Role.GATED:
        dead = stats.dead_units(t, channel_first, config.dead_sample_fraction)
        pending.put("dead", key, dead, stats.unit_count(t, channel_first))
    elif spec.role is Role.BOUNDED and spec.radius > 0:
        pending.put("saturated", key, stats.saturated_count(t, spec.center, spec.radius), t.numel())


def per_unit(spec: LayerSpec) -> bool:
    """Whether :func:`layer_output` measures anything of a layer of this spec."""
    return spec.role is Role.GATED or (spec.role is Role.BOUNDED and spec.radius > 0)


#: Layer outputs of at most this many elements each have their per-unit counts stacked (:func:`layer_outputs`):
#: in the loop of the 8x512 MLP, its 8 ReLU outputs of 128x512 cost the same stacked at the forward pass's end as
#: one by one in their hooks (alone, 659 us and 452 us; outputs of 32x256, 22 us and 69 us)
UNIT_STACK_LIMIT = 1 << 16

Deferred = tuple[Pending, SlotKey, LayerSpec, Tensor, bool]  # (step, layer, spec, output, channel_first)


@torch.no_grad()  # (the stacks copy the outputs without a graph: no detach of each, 0.6 us a layer)
def layer_outputs(entries: Sequence[Deferred], config: DebugConfig) -> None:
    """:func:`layer_output` of many layers at once: outputs of one shape, role and bound (at least
    :data:`~neuraldbg.stats.tensors.MIN_GROUP` of them, each at most :data:`UNIT_STACK_LIMIT` elements, float32) are
    stacked and reduced together, one reduction per shape instead of one per layer; the others one by one."""
    groups: dict[tuple[object, ...], list[Deferred]] = {}
    for entry in entries:
        pending, _, spec, t, cf = entry
        group = (id(pending), spec.role, spec.center, spec.radius, cf, t.shape, t.dtype, t.device)
        groups.setdefault(group, []).append(entry)
    for group_entries in groups.values():
        pending, _, spec, t, cf = group_entries[0]
        if len(group_entries) < stats.MIN_GROUP or t.numel() > UNIT_STACK_LIMIT or t.dtype is not torch.float32:
            for pending, key, spec, t, cf in group_entries:
                layer_output(pending, key, spec, t, cf, config)
            continue
        stacked = torch.stack([e[3] for e in group_entries])
        if spec.role is Role.GATED:
            units = float(stats.unit_count(t, cf))
            counts = stats.dead_units_stacked(stacked, cf, config.dead_sample_fraction)
            pending.put_vector([("dead", e[1], units) for e in group_entries], counts)
        else:
            total = float(t.numel())
            counts = stats.saturated_stacked(stacked, spec.center, spec.radius)
            pending.put_vector([("saturated", e[1], total) for e in group_entries], counts)


@torch.no_grad()
def compiled_layer_output(spec: LayerSpec, t: Tensor, config: DebugConfig) -> Tensor:
    """The statistics of one layer output in a compiled graph, packed in one float32 vector: the output's norm
    and number of elements, then (per role) dead units or saturated outputs and the units they are counted over.
    Tensor work only, with no branch on anything that changes between steps, so torch.compile traces it without a
    graph break or a recompilation."""
    t = t.detach()
    norm = torch.linalg.vector_norm(t.float())
    parts = [norm, norm.new_tensor(float(t.numel()))]
    channel_first = spec.channel_first or t.dim() >= 4
    if spec.role is Role.GATED:
        parts += [
            stats.dead_units(t, channel_first, config.dead_sample_fraction),
            norm.new_tensor(float(stats.unit_count(t, channel_first))),
        ]
    elif spec.role is Role.BOUNDED and spec.radius > 0:
        parts += [stats.saturated_count(t, spec.center, spec.radius), norm.new_tensor(float(t.numel()))]
    return torch.stack(parts)


def packed_size(spec: LayerSpec) -> int:
    """The length of a :func:`compiled_layer_output` vector for a layer of this spec."""
    return 4 if spec.role is Role.GATED or (spec.role is Role.BOUNDED and spec.radius > 0) else 2


def file_compiled(pending: Pending, key: SlotKey, spec: LayerSpec, packed: Tensor) -> None:
    """File a :func:`compiled_layer_output` vector into a step (its parts are read at the flush)."""
    parts = packed.unbind(0)
    pending.put("act", key, parts[0])
    pending.put("numel", key, parts[1])
    if len(parts) == 4:
        pending.put("dead" if spec.role is Role.GATED else "saturated", key, parts[2])
        pending.put("units", key, parts[3])


def all_norms(
    pending: Pending,
    refs: Mapping[SlotKey, Tensor],
    ends: Sequence[tuple[str, Tensor]],
    grad: Tensor,
    loss_scale: Tensor | None = None,
) -> None:
    """Every layer output's norm, the input's and the output's, and the loss gradient's, batched (one reduction
    per shape of many small outputs, see :class:`~neuraldbg.stats.tensors.NormPlan`), and the loss gradient's L1
    norm (the loss's pull on the output). ``loss_scale``: a GradScaler's scale in ``grad``, divided out (on the
    device)."""
    entries: list[Entry] = [("act", key, 0) for key in refs]
    entries += [(target, None, 0) for target, _ in ends]
    values = stats.norm_readings([*refs.values(), *(t for _, t in ends), grad])
    n = len(entries)
    pending.put_vector(entries, values[:n])
    pending.put("target_grad", None, values[n] / loss_scale if loss_scale is not None else values[n])
    # sum of |d(loss)/d(output)|, read as float32 like every reading; as abs and sum, which a CPU takes six times
    # faster than vector_norm(1) (a language model's 16x32x1000 logits: 0.43 ms against 0.07 ms; the two sum in
    # another order: equal to about 1e-6 of it, see python -m benchmarks.reductions)
    pull = grad.detach().abs().sum(dtype=stats.accumulation_dtype(grad)).float()
    pending.put("target_grad_sum", None, pull / loss_scale if loss_scale is not None else pull)


def output_dead_pulled(pending: Pending, output: Tensor, grad: Tensor) -> None:
    """Units of the model's output that are never positive on the batch while the loss pulls on them (a nonzero
    gradient on some sample): a class logit held at 0 by a ReLU that the loss wants to move. A representation whose
    loss leaves its zero units alone (a forward-forward layer's goodness, the square of each unit) has none. Units:
    channels of an image-shaped output, the last dimension otherwise."""
    if output.dim() < 2 or not output.numel() or grad.shape != output.shape or not output.is_floating_point():
        return  # (an empty batch: no sample to be positive on)
    with torch.no_grad():
        channel_first = output.dim() == 4
        never = stats.never_positive(output.detach(), channel_first)
        u = stats.unit_dim(grad, channel_first)
        # some gradient nonzero (or NaN) on a unit: its largest or its smallest is; two reductions in place cost a
        # quarter of a comparison of every element and its reduction (a language model's logits, on a CPU)
        dims = stats.other_dims(grad, u)
        g = grad.detach()
        pulled = (g.amax(dim=dims) != 0) | (g.amin(dim=dims) != 0)
        pending.put("output_dead_pulled", None, (never & pulled).sum(dtype=torch.float32), int(never.shape[0]))


# --- parameter gradients ---------------------------------------------------------------------------------


def readable(params: Sequence[Param]) -> tuple[list[tuple[str, Param, Tensor]], list[str]]:
    """Parameters that hold a gradient, with the part of it this process holds as a plain tensor
    (:meth:`Param.local`), and the names of those whose gradient cannot be read (meta tensors, unknown
    subclasses). A parameter of which this process holds no element (a shard on another rank) is left out."""
    out: list[tuple[str, Param, Tensor]] = []
    skipped: list[str] = []
    for p in params:
        g = p.tensor.grad
        if g is None:
            continue
        plain = g if p.piece is None and type(g) is Tensor and g.layout is torch.strided else p.local(g)
        if plain is None:
            skipped.append(p.name)
        elif plain.numel():
            out.append((p.name, p, plain))
    return out, skipped


def gradients(
    data: StepData,
    with_grad: Sequence[tuple[str, Param, Tensor]],
    raw: Tensor | Sequence[Tensor] | None,
    loss_scale: float = 1.0,
) -> None:
    """Gradient norms as the optimizer receives them, exact zeros, non-finite elements, and how much smaller they
    are than the backward pass left them (``raw``: norms at the end of backward, when read) - that is, clipping.

    A sharded parameter's norm is its local part's, scaled to the whole (see :mod:`neuraldbg.model.shards`);
    its element count is the whole's. ``loss_scale``: the GradScaler scale still in ``with_grad`` (read before the
    scaler unscaled them), divided out (``raw`` comes unscaled)."""
    grads = [g for _, _, g in with_grad]
    values = stats.host_values(stats.norm_readings(grads), raw)
    values, raw_values = values[: len(grads)], values[len(grads) :]
    if loss_scale != 1.0:
        values = [v / loss_scale for v in values]
    data.grad_clip_factor = clip_factor(values, raw_values)
    data.grad.clear()
    data.grad_exact_zero.clear()
    data.grad_nonfinite.clear()
    data.grad_before_clip.clear()
    if data.grad_clip_factor is not None:  # which gradients the clipping shrank, and from what
        for (name, p, g), value, before in zip(with_grad, values, raw_values):
            if math.isfinite(before) and before > 1.01 * value:
                data.grad_before_clip[name] = before * p.factor(g.numel())
    # a norm of exactly 0 or inf is ambiguous (an exact zero or an underflow; inf/NaN elements or an overflow):
    # the largest element of each such gradient tells, read for all of them in one transfer
    unclear = [i for i, v in enumerate(values) if v == 0.0 or not math.isfinite(v)]
    largest = dict(zip(unclear, stats.largest_magnitudes([with_grad[i][2] for i in unclear])))
    for i, ((name, p, g), value) in enumerate(zip(with_grad, values)):
        data.grad_numel[name] = p.numel
        top = largest.get(i)
        if top is not None:
            if top == 0.0:
                data.grad_exact_zero.add(name)
            elif value == 0.0:
                value = top / loss_scale  # underflow: the largest element bounds the norm
            if not math.isfinite(top):
                data.grad_nonfinite.add(name)
            elif not math.isfinite(value):  # an overflow of finite elements (beyond ~1.8e19 in float32): the norm
                value = stats.wide_norm(g) / loss_scale  # taken in float64, for this gradient alone
        data.grad[name] = value * p.factor(g.numel())


#: The most gradient elements :func:`functional_dead` copies into one stack (16 MB of float32) ...
_STACKED_GRADIENTS = 1 << 22
#: ... from weight gradients of at most this many elements each (larger ones are read one by one)
_GRADIENT_ROWS = 1 << 16


def functional_dead(
    pending: Pending,
    never_positive: Mapping[SlotKey, Tensor],
    infos: Mapping[str, LayerInfo],
    by_param: Mapping[str, Tensor],
    covered: set[SlotKey],
) -> None:
    """Units of a layer activated functionally (``F.relu``) that are dead: a pre-activation never positive on
    the batch *and* a weight row with exactly zero gradient. ``covered``: layers whose units an activation module
    right after them already measures."""
    groups: dict[tuple[object, ...], list[tuple[SlotKey, Tensor, Tensor]]] = {}
    for key, never in never_positive.items():
        if key in covered:
            continue
        weight = infos[key[0]].unit_weight
        unit_grad = by_param.get(weight) if weight else None
        if unit_grad is not None and unit_grad.dim() >= 1 and unit_grad.shape[0] == never.shape[0]:
            group = (never.shape, never.device, unit_grad.shape, unit_grad.dtype, unit_grad.device)
            groups.setdefault(group, []).append((key, never, unit_grad))
    # layers of one shape in one reduction (a residual stack of equal blocks: one per shape instead of four
    # operations per layer), as measure.layer_outputs does for the layers' own statistics
    for members in groups.values():
        units, size = int(members[0][1].shape[0]), members[0][2].numel()
        if len(members) >= stats.MIN_GROUP and members[0][2].dtype is torch.float32 and 0 < size <= _GRADIENT_ROWS:
            per_stack = max(stats.MIN_GROUP, _STACKED_GRADIENTS // size)  # the copy's size is bounded
            for start in range(0, len(members), per_stack):
                part = members[start : start + per_stack]
                never = torch.stack([n for _, n, _ in part])
                grads = torch.stack([g.detach() for _, _, g in part])
                counts = stats.dead_and_still_stacked(never, grads)
                pending.put_vector([("func_dead", key, units) for key, _, _ in part], counts)
            continue
        for key, never, unit_grad in members:
            both = (never & stats.zero_gradient_units(unit_grad)).sum(dtype=torch.float32)
            pending.put("func_dead", key, both, units)


def clip_factor(at_step: Sequence[float], after_backward: Sequence[float]) -> float | None:
    """How much smaller the gradients reached the optimizer than the backward pass left them (clipping), or None.

    A ratio that is an exact power of two is a loss scale being removed (a GradScaler unscaling), not clipping."""
    if not after_backward or len(after_backward) != len(at_step):
        return None
    final = math.sqrt(sum(v * v for v in at_step))
    raw = math.sqrt(sum(v * v for v in after_backward))
    if not (math.isfinite(final) and math.isfinite(raw)) or final <= 0 or raw <= final * 1.01:
        return None
    exponent = math.log2(raw / final)
    return None if abs(exponent - round(exponent)) < 1e-4 else raw / final


def updates(pending: Pending, snapshot: stats.Snapshot) -> None:
    """File what the optimizer did to the snapshotted parameters (read at the flush): every change, then every
    new norm, then every old norm (which also bounds, for a sampled parameter, a change its sample missed), in
    that order (see :func:`~neuraldbg.capture.pending.assign`)."""
    deltas, after, before = snapshot.readings()
    plan = snapshot.plan
    entries = _UPDATE_ENTRIES.get(plan)
    if entries is None:
        entries = (
            [("delta", name, scale) for name, scale in zip(plan.names, plan.scales)],
            [("weight", name, 0) for name in plan.names],
            [("before", name, 0) for name in plan.names],
        )
        _UPDATE_ENTRIES[plan] = entries
    pending.put_vector(entries[0], deltas)
    pending.put_vector(entries[1], after)
    pending.put_vector(entries[2], before)


#: The filing entries of a snapshot plan's readings, kept while the plan is.
_UPDATE_ENTRIES: weakref.WeakKeyDictionary[stats.SnapshotPlan, tuple[list[Entry], list[Entry], list[Entry]]] = (
    weakref.WeakKeyDictionary()
)


def suspicious(record: StepData, config: DebugConfig, previous_head_grad: float | None) -> bool:
    """Signals that warrant full observation of the next steps: a learning-rate change, a non-finite or
    blown-up output, a head-layer gradient ten times larger than at the previous step (an outlier batch)."""
    if record.lr_changed:
        return True
    hg = record.head_grad
    if hg is not None and previous_head_grad and (not math.isfinite(hg) or hg > 10 * previous_head_grad):
        return True
    for key, norm in record.act.items():
        if not math.isfinite(norm):
            return True
        n = record.numel.get(key, 0)
        if n and norm / math.sqrt(n) > config.anomalous_rms:
            return True
    return record.loss is not None and not math.isfinite(record.loss)
