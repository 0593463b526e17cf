"""Parallel copies of a block: the copies of one block numbered in a container (``experts.0``, ``experts.1``...,
``heads.3``) whose layers of one class, at the same place in each copy, are given the very same tensor in a forward
pass. A mixture of experts computed densely is one, as are the members of an ensemble or the heads of a hand-written
multi-head layer. The model combines their outputs (a router's weights, a mean), so a copy it stops using (a router
that no longer chooses an expert) loses its gradient and, under weight decay, its scale while its siblings train:
the model's routing, not a gradient that vanished on its way back through depth nor an output a penalty drove to
nothing. A stack of numbered blocks (``layers.0``, ``layers.1``) is no such thing: each block is given the output
of the one before, never the same tensor.

Metadata only (where a tensor's values lie, names, classes): nothing is read from the device.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def copies(fed: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The parallel copies among the layers given one tensor in one forward pass, each ``(name, class name)``: each
    copy's root (the name up to its number) -> its family (the container's name), for every numbered position at
    which two or more of those layers differ only by that number and are of one class. ``("experts.0.0", "Linear")``
    and ``("experts.2.0", "Linear")`` give ``{"experts.0": "experts", "experts.2": "experts"}``; the router given the
    same tensor, of no numbered copy, gives nothing."""
    groups: dict[tuple[str, str, str], set[str]] = {}
    for name, kind in fed:
        parts = name.split(".")
        for i, part in enumerate(parts):
            if part.isdigit():
                key = (".".join(parts[:i]), ".".join(parts[i + 1 :]), kind)
                groups.setdefault(key, set()).add(part)
    found: dict[str, str] = {}
    for (family, _, _), numbers in groups.items():
        if len(numbers) >= 2:
            for number in numbers:
                found[f"{family}.{number}" if family else number] = family
    return found


def copy_of(layer: str, parallel: Mapping[str, str]) -> str | None:
    """The root of the parallel copy that holds ``layer`` (``experts.3.2`` -> ``experts.3``), given the copies found
    so far (root -> family, see :func:`copies`); the innermost one (an expert of a mixture in one member of an
    ensemble of mixtures); None when it is in none."""
    return max((r for r in parallel if inside(layer, r)), key=len, default=None)


def inside(layer: str, root: str) -> bool:
    """Whether ``layer`` is the module ``root`` or one of its submodules (``experts.1`` holds ``experts.1.0``, not
    ``experts.10``)."""
    return layer == root or layer.startswith(root + ".")


def siblings(layer: str, parallel: Mapping[str, str]) -> list[str]:
    """The layers that stand where ``layer`` stands in the other copies of its block (``experts.3.2`` ->
    ``experts.0.2``, ``experts.1.2``...), given the copies found so far (see :func:`copy_of`); empty when ``layer``
    is in no parallel copy."""
    root = copy_of(layer, parallel)
    if root is None:
        return []
    family, rest = parallel[root], layer[len(root) :]
    return [other + rest for other, fam in parallel.items() if fam == family and other != root]
