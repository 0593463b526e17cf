"""The names NeuralDBG shows: the user's qualified module and parameter names, whatever wraps the model.

Every place that walks a model (layer descriptions, the forward hook's module map, the parameter list) goes
through :func:`named_modules` and :func:`parameters`, so a name means the same module everywhere: in events,
explanations, Mermaid graphs, traces and baselines.

Wrappers are seen through. ``DistributedDataParallel`` and ``DataParallel`` hold the model as ``module``, FSDP1
(``FullyShardedDataParallel``) as ``_fsdp_wrapped_module`` (also around each auto-wrapped layer),
``torch.compile`` as ``_orig_mod``, activation checkpointing as ``_checkpoint_wrapped_module``: the wrapper and
the module it wraps get the same name, the name the user gave the module (``'3'``, not ``'module.3'`` or
``'_fsdp_wrapped_module.3'``), and the wrapped module is the one watched. A submodule the user named ``module``
is kept: only the ``module`` child of a data-parallel wrapper is a wrapper's.

Parameters: see :class:`~neuraldbg.model.shards.Param`. FSDP1's flat parameters are split back into the
parameters the user declared (``'0.weight'``), each reading its own elements of the flat parameter's local shard.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from torch import nn

from . import shards
from .shards import Param

#: Attributes under which wrappers hold the module they wrap: FSDP1, torch.compile, activation checkpointing and
#: the flatten-parameters wrapper of older FSDP versions.
_WRAPPED_AS = frozenset({"_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module", "_fpw_module"})

_DATA_PARALLEL: tuple[type[nn.Module], ...] = (nn.DataParallel, nn.parallel.DistributedDataParallel)


def wraps(parent: nn.Module, attr: str) -> bool:
    """Whether ``parent`` is a wrapper holding the module that its child ``attr`` is."""
    return attr in _WRAPPED_AS or (attr == "module" and isinstance(parent, _DATA_PARALLEL))


def _walk(model: nn.Module) -> tuple[list[tuple[str, nn.Module]], list[tuple[str, nn.Module]]]:
    """(watched, every): each module under its user name. In ``watched`` a wrapped module replaces its wrapper
    (same name, same position); ``every`` also lists the wrappers. Shared modules appear once, under their first
    name, as in ``model.named_modules()``."""
    named: dict[str, nn.Module] = {}
    every: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:  # depth first, children in declaration order: the order of model.named_modules()
        name, module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        named[name] = module  # a wrapped module replaces its wrapper, keeping the wrapper's place
        every.append((name, module))
        children = []
        for attr, child in module._modules.items():
            if child is not None:
                children.append((name if wraps(module, attr) else f"{name}.{attr}" if name else attr, child))
        for attr, child in held_in_containers(module):
            children.append((f"{name}.{attr}" if name else attr, child))
        stack.extend(reversed(children))
    return list(named.items()), every


def held_in_containers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules that ``module`` holds in a plain list, tuple or dict attribute, named as an ``nn.ModuleList`` or
    ``nn.ModuleDict`` would name them (``'layers.0'``). They are not its submodules, so ``module.parameters()``,
    ``.to()`` and ``state_dict()`` do not see them (the layers of pytorch/examples' forward-forward network, each
    trained by an optimizer of its own; or layers meant to train that no optimizer built from
    ``model.parameters()`` holds). They are watched all the same. Attributes whose name starts with ``_`` are
    left alone: that is how a module is hidden on purpose (a teacher kept out of the state dict)."""
    found: list[tuple[str, nn.Module]] = []
    for attr, value in vars(module).items():
        if attr.startswith("_") or not isinstance(value, (list, tuple, dict)):
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(item, nn.Module) and (not isinstance(key, str) or "." not in key):
                found.append((f"{attr}.{key}", item))
    return found


def unregistered(model: nn.Module) -> set[str]:
    """The names of the modules :func:`named_modules` finds through :func:`held_in_containers` (and their own
    submodules): modules the model uses that are not its registered submodules."""
    registered = {id(m) for m in model.modules()}
    return {name for name, m in _walk(model)[1] if id(m) not in registered}


def unwrap(model: nn.Module) -> nn.Module:
    """The user's own model inside its wrappers (the module named ``""``)."""
    return _walk(model)[0][0][1]


def class_name(module: nn.Module) -> str:
    """The name of the module's class as the user wrote it. FSDP2's ``fully_shard`` swaps a module's class for a
    generated subclass (``FSDPLinear``, of ``FSDPModule`` and ``Linear``): the user's is the other base."""
    cls: type = type(module)
    fsdp = sys.modules.get("torch.distributed.fsdp")
    marker = getattr(fsdp, "FSDPModule", None)
    if isinstance(marker, type) and issubclass(cls, marker) and len(cls.__bases__) == 2:
        first, second = cls.__bases__
        if issubclass(first, marker) and not issubclass(second, marker):
            cls = second
    return cls.__name__


def named_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """Every module under its user name (the model itself is ``""``), wrappers seen through."""
    yield from _walk(model)[0]


class Parameters:
    """The model's parameters under user names: ``params`` (each once, under its first name) and, per module,
    the parameters it holds directly (:meth:`owned_by`; a shared weight is held by each module that holds it)."""

    def __init__(self, model: nn.Module) -> None:
        watched, every = _walk(model)
        names = {id(m): n for n, m in every}
        self.params: list[Param] = []
        self._owned: dict[int, list[Param]] = {}
        by_id: dict[int, Param] = {}
        sizes = shards.unsharded_sizes(m for _, m in every)
        for name, module in every:
            for attr, p in module._parameters.items():
                if p is None:
                    continue
                if shards.is_flat(p):  # FSDP1 without use_orig_params: the parameters it flattened
                    if id(p) not in by_id:
                        by_id[id(p)] = Param(name, p)  # a marker: its pieces are listed
                        for owner, piece in shards.pieces(p, names):
                            self.params.append(piece)
                            self._owned.setdefault(id(owner), []).append(piece)
                    continue
                ref = by_id.get(id(p))
                if ref is None:
                    full = f"{name}.{attr}" if name else attr
                    ref = Param(full, p, sizes.get((id(module), attr)))
                    by_id[id(p)] = ref
                    self.params.append(ref)
                self._owned.setdefault(id(module), []).append(ref)
        self.modules = watched

    def owned_by(self, module: nn.Module) -> list[Param]:
        return list(self._owned.get(id(module), ()))


def parameters(model: nn.Module) -> list[Param]:
    """Every parameter of the model under its user name, each once (a shared parameter under its first name)."""
    return Parameters(model).params
