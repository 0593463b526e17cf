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


@torch.no_grad()
def norms(tensors: Sequence[Tensor]) -> list[Tensor]:
    """L2 norm of each tensor, as 0-d float32 tensors, in as few kernel launches as possible.

    ``torch._foreach_norm`` reduces a whole list in one call; tensors are grouped by device and dtype so
    half-precision tensors are reduced in float32 (a float16 norm overflows at 65504).
    """
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
        else:
            result = [torch.linalg.vector_norm(t).float() for t in group]
        for i, r in zip(idx, result):
            out[i] = r
    return [r for r in out if r is not None]


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
    if t.dim() < 2:
        return (t <= 0).sum(dtype=torch.float32)
    u = unit_dim(t, channel_first)
    other = [d for d in range(1, t.dim()) if d != u]
    per_sample = t.amax(dim=other) if other else t  # [batch, units]
    active = (per_sample > 0).sum(dim=0)
    allowed = int(sample_fraction * per_sample.shape[0])
    return (active <= allowed).sum(dtype=torch.float32)


def unit_count(t: Tensor, channel_first: bool) -> int:
    return 1 if t.dim() < 2 else int(t.shape[unit_dim(t, channel_first)])


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
def exact_zero_and_finite(t: Tensor) -> tuple[bool, bool]:
    """(all elements are exactly 0, all elements are finite). Costs a device sync; used only to disambiguate
    a norm that came out as 0 (underflow or true zero) or inf (overflow or inf/NaN elements)."""
    low, high = torch.aminmax(t.reshape(-1).float())
    lo, hi = float(low), float(high)
    return lo == 0.0 and hi == 0.0, math.isfinite(lo) and math.isfinite(hi)


def to_host(tensors: Iterable[Tensor]) -> list[float]:
    """Move 0-d tensors to the host in one transfer per device, preserving order."""
    items = list(tensors)
    if not items:
        return []
    devices = {t.device for t in items}
    if len(devices) == 1:
        return torch.stack([t.float() if t.dtype != torch.float32 else t for t in items]).tolist()
    out: list[float] = [0.0] * len(items)
    for device in devices:
        idx = [i for i, t in enumerate(items) if t.device == device]
        values = torch.stack([items[i].float() for i in idx]).tolist()
        for i, v in zip(idx, values):
            out[i] = v
    return out
