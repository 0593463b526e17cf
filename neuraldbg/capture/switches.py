"""A ``requires_grad`` attribute set on a module: ``model.encoder.requires_grad = False`` (or ``= True`` to unfreeze
a block of a gradual unfreezing) stores a plain attribute on the ``nn.Module``, which has no such switch: its
parameters keep the flag they had (``module.requires_grad_(False)`` was meant, which sets theirs). Read on fully
observed forward passes: one dictionary lookup per module, nothing from the device.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn


def look(modules: Iterable[tuple[str, nn.Module]]) -> list[tuple[str, bool, tuple[str, ...], int]]:
    """Each module given a ``requires_grad`` attribute of its own: (its name, the value set, the qualified names of
    its parameters that require a gradient, how many parameters it holds)."""
    found = []
    for name, module in modules:
        value = module.__dict__.get("requires_grad")
        if isinstance(value, bool):
            params = list(module.named_parameters())
            trainable = tuple(f"{name}.{p}" for p, t in params if t.requires_grad)
            found.append((name, value, trainable, len(params)))
    return found
