"""Cheap tensor statistics, computed on the tensors' own device under ``torch.no_grad()``.

Nothing here moves data to the host: every function returns small tensors, and :func:`to_host` moves a whole
batch of them in one transfer (one ``.tolist()`` per device), never one ``.item()`` per layer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def first_tensor(value: object) -> Tensor | None:
    """The first floating-point tensor in a module output (tensor, tuple, list, dict, PackedSequence)."""
    if isinstance(value, Tensor):
        return value if value.is_floating_point() else None
    data = getattr(value, "data", None)  # PackedSequence
    if isinstance(data, Tensor) and not isinstance(value, Tensor):
        return data if data.is_floating_point() else None
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def data_argument(args: tuple[object, ...], kwargs: dict[str, object] | None = None) -> Tensor | None:
    """The input batch of a model call: its first tensor argument (positional first, then keyword), when it is
    floating point; None when that first tensor is not (token ids, indices: their values are never non-finite).

    Later arguments are not data: an additive attention mask (``nn.Transformer.generate_square_subsequent_mask``,
    ``-inf`` above the diagonal) is passed after the tokens it masks, and its ``-inf`` is how masking works."""
    for value in (*args, *(kwargs or {}).values()):
        found = _first_any(value)
        if found is not None:
            return found if found.is_floating_point() else None
    return None


def _first_any(value: object) -> Tensor | None:
    """The first tensor of any dtype in a value (tensor, PackedSequence, tuple, list, dict)."""
    if isinstance(value, Tensor):
        return value
    data = getattr(value, "data", None)  # PackedSequence
    if isinstance(data, Tensor):
        return data
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_any(item)
            if found is not None:
                return found
    return None


def readable(t: Tensor) -> Tensor | None:
    """``t`` itself when it is a plain strided tensor, else :func:`dense` of it (sparse tensors: their values;
    None for a meta tensor or a subclass that cannot be read)."""
    return dense(t)


def class_count(value: object) -> int:
    """The size of the last dimension of a model's logits (a classifier's classes, a language model's vocabulary):
    the ``logits`` of a Hugging Face output, else the first floating tensor of two or more dimensions in the output;
    0 when there is none. Shape only: nothing is read."""
    logits = getattr(value, "logits", None)
    if isinstance(logits, Tensor) and logits.is_floating_point() and logits.dim() >= 2:
        return int(logits.shape[-1])
    if isinstance(value, Tensor):
        return int(value.shape[-1]) if value.is_floating_point() and value.dim() >= 2 else 0
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            found = class_count(item)
            if found:
                return found
    return 0


@torch.no_grad()
def in_unit_interval(t: Tensor) -> Tensor:
    """1.0 when every element of ``t`` lies in [0, 1] (probabilities), else 0.0: a 0-d tensor, on ``t``'s device."""
    t = t.detach()
    return ((t.amin() >= 0) & (t.amax() <= 1)).float()


#: Tensor types whose values the reductions read directly.
_PLAIN = (Tensor, torch.nn.Parameter)


def dense(t: Tensor) -> Tensor | None:
    """A plain strided tensor whose L2 norm equals ``t``'s, or None when ``t``'s values cannot be read here.

    Sparse tensors give their coalesced values (duplicates summed first), quantized ones their dequantized
    values, a ``DTensor`` (FSDP2, tensor parallelism) its local shard (the norm of a shard, not of the whole: see
    docs/distributed.md on sharded parameters). Meta tensors hold no values and unknown tensor subclasses may not
    support the reductions: both give None, and the caller skips them with a warning.
    """
    if type(t) in _PLAIN and t.layout is torch.strided and not t.is_quantized:
        return None if t.is_meta else t
    if t.is_meta:
        return None
    to_local = getattr(t, "to_local", None)
    if callable(to_local):  # DTensor
        local = to_local()
        return dense(local) if isinstance(local, Tensor) and local is not t else None
    if t.is_sparse:
        return t.detach().coalesce().values()
    if t.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        return t.detach().values()
    if t.is_quantized:
        return t.dequantize()
    if type(t) not in _PLAIN:  # another subclass: usable only if it behaves as a plain tensor
        try:
            plain = t.as_subclass(Tensor)
        except Exception:
            return None
        return plain if plain.layout is torch.strided else None
    return None


def norms(tensors: Sequence[Tensor]) -> list[Tensor]:
    """L2 norm of each tensor, as 0-d float32 tensors, in as few kernel launches as possible.

    ``torch._foreach_norm`` reduces a whole list in one call; tensors are grouped by device and dtype so
    half-precision tensors are reduced in float32 (a float16 norm overflows at 65504), complex and float64
    tensors one by one. Every tensor must be plain and strided (see :func:`dense`). This runs in every fully
    observed step's hot path, so the common case (one device, float32) takes a short way.
    """
    with torch.no_grad():
        if all(t.dtype is torch.float32 for t in tensors):
            try:
                return list(torch._foreach_norm(list(tensors)))
            except RuntimeError:  # tensors on several devices
                pass
        return _grouped_norms(tensors)


def _grouped_norms(tensors: Sequence[Tensor]) -> list[Tensor]:
    out: list[Tensor | None] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    for (_, dtype), idx in groups.items():
        group = [tensors[i] for i in idx]
        result: Sequence[Tensor]
        if dtype in _LOW_PRECISION:
            result = torch._foreach_norm(group, 2, dtype=torch.float32)
        elif dtype == torch.float32:
            result = torch._foreach_norm(group)
        else:  # float64, complex, integer: one by one (a complex norm is real)
            result = [
                torch.linalg.vector_norm(t.float() if not t.is_floating_point() and not t.is_complex() else t).float()
                for t in group
            ]
        for i, r in zip(idx, result):
            out[i] = r
    return [r for r in out if r is not None]


def device_largest_magnitudes(tensors: Sequence[Tensor]) -> list[Tensor]:
    """:func:`largest_magnitudes` left on the device (0-d tensors, read at a flush): one
    ``torch._foreach_norm(..., inf)`` per device and dtype; inf or NaN exactly when the tensor holds an inf or a NaN
    (an L2 norm overflows on large finite values). Every tensor must be plain and strided (see :func:`dense`)."""
    out: list[Tensor | None] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    with torch.no_grad():
        for idx in groups.values():
            for i, r in zip(idx, torch._foreach_norm([tensors[i] for i in idx], math.inf)):
                out[i] = r
    return [r for r in out if r is not None]


def host_norm(t: Tensor) -> float | None:
    """The L2 norm of a tensor as a Python float (a host read: on a GPU, a sync; used on CPU tensors); None when its
    values cannot be read here (see :func:`dense`; a sparse tensor is read through its values). A half-precision
    tensor is reduced in float32: the norm of float16 values overflows at 65504 long before any of them does (a
    scaled loss gradient, an autocast output)."""
    with torch.no_grad():
        plain = readable(t)
        if plain is None:
            return None
        dtype = torch.float32 if plain.dtype in _LOW_PRECISION else None
        return float(torch.linalg.vector_norm(plain.detach(), dtype=dtype))


def unit_dim(t: Tensor, channel_first: bool) -> int:
    """The dimension that indexes units: features (last) for dense outputs, channels (1) for conv maps."""
    if t.dim() <= 2:
        return t.dim() - 1
    return 1 if channel_first else t.dim() - 1


@torch.no_grad()
def dead_units(t: Tensor, channel_first: bool, sample_fraction: float) -> Tensor:
    """Number of units active (> 0) on at most ``sample_fraction`` of the samples, as a 0-d float32 tensor.

    A sample is one element of the batch (dim 0); a unit of a conv map is active on a sample when it is
    positive anywhere on that sample's map, so sparse but healthy feature detectors are not called dead.
    """
    if t.dim() < 2:  # no batch dimension: every element is a unit, observed on one sample
        return (t <= 0).sum(dtype=torch.float32)
    u = unit_dim(t, channel_first)
    other = [d for d in range(1, t.dim()) if d != u]
    per_sample = t.amax(dim=other) if other else t  # [batch, units]
    allowed = int(sample_fraction * per_sample.shape[0])
    if allowed == 0:  # dead = positive on no sample: the largest value over the batch says it, 10x cheaper
        return (per_sample.amax(dim=0) <= 0).sum(dtype=torch.float32)
    active = (per_sample > 0).sum(dim=0, dtype=torch.int32)
    return (active <= allowed).sum(dtype=torch.float32)


def unit_count(t: Tensor, channel_first: bool) -> int:
    """The number of units :func:`dead_units` counts over: the size of the unit dimension, or every element of
    an output without a batch dimension."""
    return t.numel() if t.dim() < 2 else int(t.shape[unit_dim(t, channel_first)])


@torch.no_grad()
def never_positive(t: Tensor, channel_first: bool) -> Tensor:
    """Boolean per unit: the unit's output is <= 0 on every element of the batch (a pre-activation that a
    following ReLU would zero everywhere)."""
    if t.dim() < 2:
        return (t <= 0).reshape(-1)
    u = unit_dim(t, channel_first)
    return t.movedim(u, -1).reshape(-1, t.shape[u]).amax(dim=0) <= 0


@torch.no_grad()
def zero_gradient_units(grad: Tensor) -> Tensor:
    """Boolean per output unit (row of a weight's gradient): the unit received exactly zero gradient."""
    rows = grad.reshape(grad.shape[0], -1)
    low, high = torch.aminmax(rows, dim=1)
    return (low == 0) & (high == 0)


@torch.no_grad()
def saturated_count(t: Tensor, center: float, radius: float) -> Tensor:
    """Number of elements with ``|t - center| >= radius`` (at or beyond a saturating bound), as float32."""
    d = t - center if center else t
    return (d.abs() >= radius).sum(dtype=torch.float32)


@torch.no_grad()
def largest_magnitudes(tensors: Sequence[Tensor]) -> list[float]:
    """max |t| of each tensor, moved to the host in one transfer: 0 only for an exactly-zero tensor (a norm of 0
    can also be an underflow), non-finite only when an element is (a norm of inf can also be an overflow)."""
    if not tensors:
        return []
    with torch.no_grad():
        if all(t.dtype is torch.float32 for t in tensors):
            return to_host(torch._foreach_norm(list(tensors), math.inf))
        return to_host([torch.linalg.vector_norm(t.float(), math.inf) for t in tensors])


class Snapshot:
    """What the optimizer will do to some parameters, measured without copying them all.

    Before the step: a copy of an evenly strided sample of at most ``sample`` elements per parameter (the whole
    parameter when it is smaller: then its change is exact), and the norm of each parameter (one batched
    reduction). After the step, :meth:`changes` gives per parameter the sample change's norm, the new norm and the
    old norm, all batched; :func:`update_norm` turns them into ||dW||: the sample's
    change scaled to the whole parameter or, when the sample did not change but the norm did (a sparse update the
    sample missed), the change of the norm, which bounds ||dW|| from below. A parameter is unchanged (exactly 0)
    only when its sample and its norm both are.
    """

    def __init__(self, names: Sequence[str], params: Sequence[Tensor], sample: int = 65536) -> None:
        self.names = list(names)
        with torch.no_grad():
            self._params = [p.detach() for p in params]
            views = [_sample(p, sample) for p in self._params]
            self._samples = [v for v, _ in views]
            self.scales = [s for _, s in views]
            self._before = norms(self._params) if self._params else []  # every parameter's norm before the step
            self._copies = list(torch._foreach_mul(self._samples, 1.0)) if self._samples else []  # one copy

    def changes(self) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """(sample change norms, norms after, norms before), each one 0-d tensor per parameter."""
        with torch.no_grad():
            after = norms(self._params)
            deltas = norms(list(torch._foreach_sub(self._samples, self._copies)))
        return deltas, after, list(self._before)


def _sample(p: Tensor, limit: int) -> tuple[Tensor, float]:
    """A strided view of at most ``limit`` elements of ``p`` and the factor that scales its norms to ``p``."""
    n = p.numel()
    if n <= limit or not p.is_contiguous():
        return p, 1.0
    stride = -(-n // limit)
    view = p.view(-1)[::stride]
    return view, math.sqrt(n / view.numel())


def update_norm(sample_delta: float, scale: float, after: float, before: float) -> float:
    """||dW|| from a :class:`Snapshot` reading (see there)."""
    if sample_delta > 0 or math.isnan(sample_delta):
        return sample_delta * scale
    return abs(after - before)


def to_host(tensors: Iterable[Tensor]) -> list[float]:
    """Move 0-d tensors to the host in one transfer per device, preserving order."""
    items = list(tensors)
    if not items:
        return []
    try:  # one device (the common case): one stack, which promotes mixed dtypes, and one transfer
        return list(torch.stack(items).tolist())
    except RuntimeError:  # tensors on several devices
        devices = {t.device for t in items}
    out: list[float] = [0.0] * len(items)
    for device in devices:
        idx = [i for i, t in enumerate(items) if t.device == device]
        values = torch.stack([items[i].float() for i in idx]).tolist()
        for i, v in zip(idx, values):
            out[i] = v
    return out
