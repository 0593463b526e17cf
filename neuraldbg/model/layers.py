"""Which modules are watched, and what their outputs mean.

A *layer* is any submodule the forward pass calls: leaves, modules that own parameters directly
(``nn.MultiheadAttention`` owns ``in_proj_weight`` and computes with its ``out_proj`` child without calling it),
and containers. Roles decide which statistics make sense: per-unit activity only for ReLU-family outputs,
saturation only for bounded activations (never for Linear outputs or logits), gradients only for layers that own
parameters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn
from torch.nn.utils import parametrize

from . import naming
from .info import Bound, LayerInfo, Role

#: Layers whose weight's first dimension indexes the output units along ``unit_dim``.
_UNIT_LAYERS: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Bilinear,
    nn.modules.conv._ConvNd,
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
)
_NORMALIZING: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)
#: Normalisations that standardise each channel (feature) with statistics shared by all its positions: whatever
#: per-channel scale and shift the layer feeding them applies (a bias, or another norm's affine weight and bias)
#: is divided out again, so that layer's parameters get no gradient by construction. (LayerNorm and GroupNorm
#: standardise each sample across channels instead: a per-channel affine before them still matters.)
_RENORMALIZING: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
)
_CHANNEL_FIRST: tuple[type[nn.Module], ...] = (
    nn.modules.conv._ConvNd,
    nn.modules.batchnorm._NormBase,
    nn.GroupNorm,
)


def saturation_bound(module: nn.Module, derivative: float) -> Bound | None:
    """Where ``module``'s derivative falls below ``derivative`` times its maximum, as an output-space bound.

    Hard-clipping activations (Hardtanh, ReLU6's upper bound, Hardsigmoid) have a zero derivative exactly at
    their bounds; smooth ones (tanh, sigmoid, softsign) approach it.
    """
    keep = math.sqrt(max(0.0, 1.0 - derivative))
    if isinstance(module, nn.Tanh):
        return Bound(0.0, keep)  # tanh' = 1 - y^2
    if isinstance(module, nn.Sigmoid):
        return Bound(0.5, 0.5 * keep)  # sigmoid' = y (1 - y), maximum 1/4
    if isinstance(module, nn.Softsign):
        return Bound(0.0, 1.0 - math.sqrt(derivative))  # softsign' = (1 - |y|)^2
    if isinstance(module, nn.Hardsigmoid):
        return Bound(0.5, 0.5)
    if isinstance(module, nn.Hardtanh) and not isinstance(module, nn.ReLU6):
        low, high = float(module.min_val), float(module.max_val)
        return Bound((low + high) / 2, (high - low) / 2)
    return None


def role_of(module: nn.Module, derivative: float, parametric: bool | None = None) -> tuple[Role, Bound | None]:
    """The module's role; ``parametric``: whether it holds parameters (default: it has parameters of its own;
    under FSDP1 a module's parameters may live in a flat parameter elsewhere)."""
    if isinstance(module, (nn.ReLU, nn.ReLU6)) or (isinstance(module, nn.LeakyReLU) and module.negative_slope == 0):
        return Role.GATED, None
    bound = saturation_bound(module, derivative)
    if bound is not None:
        return Role.BOUNDED, bound
    if parametric is None:
        parametric = any(True for _ in module.parameters(recurse=False))
    if parametric:
        return Role.PARAMETRIC, None
    return Role.OTHER, None


def _unit_original(module: nn.Module, params: naming.Parameters) -> str | None:
    """The parameter a parametrized weight is computed from whose rows are the layer's output units, read as it is
    (nothing is computed): weight_norm's direction ``original1`` (its magnitude ``original0`` has one element per
    unit), spectral_norm's ``original``. None when no original has one row per unit."""
    units = next((n for a in _UNIT_COUNTS if isinstance(n := getattr(module, a, None), int)), None)
    holders = module.parametrizations
    holder = holders["weight"] if isinstance(holders, nn.ModuleDict) and "weight" in holders else None
    if holder is None:
        return None
    originals = [
        (p.numel, p.name)
        for p in params.owned_by(holder)
        if p.tensor.dim() >= 1 and p.tensor.shape[0] == units and p.piece is None
    ]
    return max(originals)[1] if originals else None


#: The attribute that counts a unit layer's output units.
_UNIT_COUNTS = ("out_features", "out_channels", "num_features")


def describe(model: nn.Module, derivative: float) -> dict[str, LayerInfo]:
    """LayerInfo for the model itself ("") and every watched module, keyed by its user name (see
    :mod:`neuraldbg.model.naming`: wrappers such as DDP or FSDP are seen through)."""
    params = naming.Parameters(model)  # a shared weight is named by its first name
    infos: dict[str, LayerInfo] = {}
    for name, module in params.modules:
        own = params.owned_by(module)
        role, bound = role_of(module, derivative, bool(own)) if name else (Role.OTHER, None)
        unit_weight = None
        if isinstance(module, _UNIT_LAYERS):
            # A parametrized weight is computed on every read, and reading it may change the run: spectral_norm's
            # power iteration updates its vectors at each read in train mode. It is never an own parameter.
            if parametrize.is_parametrized(module, "weight"):
                unit_weight = _unit_original(module, params)
            else:
                weight = getattr(module, "weight", None)
                own_name = f"{name}.weight" if name else "weight"
                unit_weight = next(
                    (p.name for p in own if p.tensor is weight or (p.piece is not None and p.name == own_name)), None
                )
        infos[name] = LayerInfo(
            name=name,
            type_name=naming.class_name(module),
            role=role,
            params=tuple(p.name for p in own),
            numel=sum(p.numel for p in own),
            channel_first=isinstance(module, _CHANNEL_FIRST),
            bound=bound,
            unit_weight=unit_weight,
            normalizes=isinstance(module, _NORMALIZING),
            renormalizes_channels=isinstance(module, _RENORMALIZING),
            groups=int(module.groups) if isinstance(module, nn.modules.conv._ConvNd) else 1,
        )
    return infos


#: Layers whose computation differs between ``train()`` and ``eval()``.
_MODE_DEPENDENT: tuple[type[nn.Module], ...] = (
    nn.modules.dropout._DropoutNd,
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
)


def mode_dependent_layers(named: Iterable[tuple[str, nn.Module]]) -> list[str]:
    """'name' (Type) of every module whose forward depends on ``module.training``, as the model stands now (when
    the debugger attaches): dropout with a probability above 0, batch and instance norm whose running statistics
    have not been learned yet, recurrent layers and attention with a dropout probability.

    A normalisation layer that already tracked batches (``num_batches_tracked`` above 0: a pretrained or resumed
    model) is left out: training it in eval mode keeps its learned statistics, the usual way to fine-tune with
    frozen batch norm. Statistics never learned (0 and 1 from the initialisation) frozen by eval mode are no
    normalisation at all."""
    found = []
    for name, module in named:
        depends = isinstance(module, _MODE_DEPENDENT) and (
            not isinstance(module, nn.modules.batchnorm._NormBase)
            or (module.track_running_stats and not _tracked(module))
        )
        if isinstance(module, nn.modules.dropout._DropoutNd) and not float(getattr(module, "p", 0.0)) > 0:
            depends = False
        if isinstance(module, (nn.RNNBase, nn.MultiheadAttention)) and float(getattr(module, "dropout", 0.0)) > 0:
            depends = True
        if depends and name:
            found.append(f"'{name}' ({type(module).__name__})")
    return found


def heavy_dropout_layers(named: Iterable[tuple[str, nn.Module]], limit: float) -> list[tuple[str, float]]:
    """'name' (Type) and the probability of every dropout module (and recurrent layer or attention with a dropout)
    that drops at least ``limit`` of its inputs in training mode, as the model stands when the debugger attaches."""
    found = []
    for name, module in named:
        if isinstance(module, nn.modules.dropout._DropoutNd):
            p = float(getattr(module, "p", 0.0))
        elif isinstance(module, (nn.RNNBase, nn.MultiheadAttention)):
            p = float(getattr(module, "dropout", 0.0))
        else:
            continue
        if p >= limit and name:
            found.append((f"'{name}' ({type(module).__name__})", p))
    return found


def _tracked(module: nn.Module) -> bool:
    """Whether a normalisation layer's running statistics were already learned: it counted batches before."""
    counted = getattr(module, "num_batches_tracked", None)
    if not isinstance(counted, torch.Tensor) or counted.numel() != 1 or counted.is_meta:
        return False
    try:
        return int(counted) > 0  # one read when the debugger attaches
    except RuntimeError:  # a tensor whose value cannot be read here
        return False
