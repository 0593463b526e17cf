"""Parameters as the user declared them, and the part of each that this process holds.

Under data parallelism (DDP) every rank holds every parameter whole. Under sharding it holds a part:

* FSDP2 (``fully_shard``) and tensor parallelism make parameters ``DTensor`` s; a rank holds its local shard
  (rows of the parameter, for FSDP2's ``Shard(0)``), possibly empty (a bias of one element on two ranks);
* FSDP1 (``FullyShardedDataParallel``) flattens a module's parameters into one flat parameter and gives each
  rank a contiguous slice of it. With ``use_orig_params=True`` the original parameters are kept as 1-D views of
  that slice (empty where the slice misses them); without it, only the flat parameter exists, and each
  original parameter is a :class:`Param` *piece*: its elements of the flat parameter's local slice, found from
  the flat parameter's own record of what it holds.

Statistics of a sharded parameter are computed on the local part only, without any collective (a collective in
a training hook would deadlock the job as soon as one rank skipped it): a norm is the local part's norm scaled
to the whole parameter, ``||local|| * sqrt(numel / local numel)`` (the whole's norm when the energy is spread
evenly over the shards; exact zeros and inf/NaN stay what they are), an update ratio ``||dW|| / ||W||`` is the
local part's (the same on average), and a rank holding nothing of a parameter does not read it at all. Each
rank's diagnosis is therefore about its own shards, and the job's diagnosis (see
:mod:`neuraldbg.distributed.gather`) says which ranks show each fault.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from torch import Tensor, nn

from ..stats import tensors as stats

_FLAT_FIELDS = ("_param_infos", "_numels", "_shard_param_infos")
_PLAIN = (Tensor, nn.Parameter)


class Param:
    """One parameter as the user declared it.

    ``tensor`` is what the optimizer holds: the parameter itself or, for a piece of an FSDP1 flat parameter, the
    flat parameter. :attr:`numel` is its size over every rank (given for FSDP1's pieces and views, whose tensors
    hold only a shard; otherwise the tensor's own count, which a DTensor gives for the whole and a lazy parameter
    gives as 0 until it is materialised). ``piece`` (for pieces) is the slice of the flat parameter's local
    shard that holds its elements on this rank. It holds no module: the debugger holds the model weakly.
    """

    __slots__ = ("_numel", "name", "piece", "tensor")

    def __init__(self, name: str, tensor: Tensor, numel: int | None = None, piece: slice | None = None) -> None:
        self.name = name
        self.tensor = tensor
        self._numel = numel
        self.piece = piece

    @property
    def numel(self) -> int:
        if self._numel is not None:
            return self._numel
        # a plain tensor (the common case, read per parameter and step) is no lazy parameter: no slow type check
        if type(self.tensor) not in _PLAIN and isinstance(self.tensor, nn.parameter.UninitializedParameter):
            return 0
        return int(self.tensor.numel())

    @property
    def whole(self) -> bool:
        """This process holds the whole parameter as a plain tensor (no shard, piece or view of a flat one)."""
        return self.piece is None and self._numel is None and type(self.tensor) in _PLAIN

    @property
    def requires_grad(self) -> bool:
        return bool(self.tensor.requires_grad)

    def local(self, t: Tensor) -> Tensor | None:
        """The elements of ``t`` (this parameter, its gradient or a detached copy) held by this process, as a
        plain strided tensor; empty when it holds none; None when they cannot be read (see :func:`stats.dense`)."""
        if self.piece is not None:
            flat = stats.dense(t)
            return flat.reshape(-1)[self.piece] if flat is not None else None
        return stats.dense(t)

    def factor(self, local_numel: int) -> float:
        """What scales a norm over ``local_numel`` of this parameter's elements to the whole parameter."""
        if 0 < local_numel < self.numel:
            return math.sqrt(self.numel / local_numel)
        return 1.0

    def __repr__(self) -> str:
        return f"Param({self.name!r}, numel={self.numel})"


def is_flat(p: object) -> bool:
    """An FSDP1 flat parameter (it records which original parameters it holds, and where)."""
    return all(hasattr(p, field) for field in _FLAT_FIELDS)


def pieces(flat: Tensor, names: Mapping[int, str]) -> Iterator[tuple[nn.Module, Param]]:
    """The parameters an FSDP1 flat parameter holds, each reading its slice of the local shard, with the module
    that declared it. ``names``: user name by module id."""
    infos: Any = getattr(flat, "_param_infos")  # noqa: B009 - FSDP's own attributes, checked by is_flat()
    numels: Any = getattr(flat, "_numels")  # noqa: B009
    shard: Any = getattr(flat, "_shard_param_infos")  # noqa: B009
    for info, numel, where in zip(infos, numels, shard):
        owner = names.get(id(info.module))
        if owner is None:
            continue
        name = f"{owner}.{info.param_name}" if owner else str(info.param_name)
        if where.in_shard:
            start = int(where.offset_in_shard)
            piece = slice(start, start + int(where.numel_in_shard))
        else:
            piece = slice(0, 0)
        yield info.module, Param(name, flat, int(numel), piece)


def unsharded_sizes(modules: Iterable[nn.Module]) -> dict[tuple[int, str], int]:
    """(module id, attribute) -> elements of the whole parameter, for parameters FSDP1 keeps as views of a shard
    (``use_orig_params=True``), whose own ``numel()`` is only the local part."""
    sizes: dict[tuple[int, str], int] = {}
    for module in modules:
        flat = getattr(getattr(module, "_handle", None), "flat_param", None)
        if flat is None or not is_flat(flat):
            continue
        for info, numel in zip(getattr(flat, "_param_infos"), getattr(flat, "_numels")):  # noqa: B009
            sizes[(id(info.module), str(info.param_name))] = int(numel)
    return sizes
