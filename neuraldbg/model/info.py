"""What the engine knows about each watched layer: its role and the facts the statistics need.

Fixed when the debugger attaches (:func:`neuraldbg.model.layers.describe`); torch-free, so detectors and reports
read it without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Role(str, Enum):
    GATED = "gated"  # ReLU family: a hard zero region where the gradient is 0 (units can die)
    BOUNDED = "bounded"  # tanh, sigmoid, ...: saturating outputs whose derivative goes to 0
    PARAMETRIC = "parametric"  # owns parameters (Linear, Conv, norms, embeddings, RNNs, attention)
    OTHER = "other"  # dropout, pooling, flatten, GELU, ...


@dataclass(frozen=True)
class Bound:
    """Saturation test for a bounded activation: ``|y - center| >= radius`` means saturated."""

    center: float
    radius: float


@dataclass(frozen=True)
class LayerInfo:
    name: str  # qualified module name, "" for the model itself
    type_name: str
    role: Role
    params: tuple[str, ...]  # qualified names of the parameters the module owns directly
    numel: int  # number of parameter elements owned directly
    channel_first: bool  # units along dim 1 (conv, batch norm) rather than the last dim
    bound: Bound | None = None  # for Role.BOUNDED
    unit_weight: str | None = None  # qualified name of the weight whose rows are the output units
    normalizes: bool = False  # a normalisation layer: rescaling its input is its job
    renormalizes_channels: bool = False  # BatchNorm, InstanceNorm: cancels a per-channel affine right before it
    groups: int = 1  # a grouped convolution's groups: its units of different groups read different input channels


def owner_of_params(infos: dict[str, LayerInfo]) -> dict[str, str]:
    """Qualified parameter name -> the layer that owns it."""
    owners: dict[str, str] = {}
    for name, info in infos.items():
        for p in info.params:
            owners.setdefault(p, name)
    return owners
