"""Views that mix samples: a tensor whose batch stands on a later axis (a sequence-first LSTM's ``(T, N, H)``
output, a multi-layer ``h_n`` of ``(layers, N, H)``) given ``view`` or ``reshape`` a shape whose first axis is as
long as the batch, ``(N, T * H)``. A view keeps the order of the values in memory, so row ``n`` of the result holds
the values of positions ``n * T / N`` onwards of the first axis: pieces of other samples, not sample ``n``. What
``permute(1, 0, 2)`` (or ``transpose``) before it, or ``batch_first=True``, puts right.

Read once per fully observed pass, before its backward call, on the first :data:`CHECKS` passes whose loss scores
one target per sample (:func:`~neuraldbg.capture.loss_graph.sample_targets`: its count is the batch): a walk of the
graph below the loss (at most :data:`BUDGET` nodes), the sizes autograd saved for each view and reshape, nothing
computed. A view counts when its input has the batch's length on an axis after the first, the axes before it
hold more than one value together, the input's first axis is not as long as the batch (a batch-first tensor that
happens to hold as many channels as samples), and its result's first axis is as long as the batch, not the first
of axes that split the input's first one (``(N * T, H)`` given back ``(N, T, H)``: the samples sit in that first
axis, whatever ``H`` is). A view after
``permute`` sees the permuted shape (a reshape of a permuted tensor copies it in its new order): not counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torch import Tensor

from .loss_graph import hold, made_shape

#: Fully observed passes whose graph is read, at most: a program lays out its tensors the same way on every pass.
CHECKS = 4
#: Graph nodes walked below the loss, at most.
BUDGET = 50_000
#: Graph nodes below a view within which the layer whose output it reshapes is looked for.
NEAR = 8

_VIEWS = frozenset({"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0"})


def mixed(
    roots: list[Tensor], samples: int, owner: Callable[[object], tuple[str, bool] | None]
) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """Every view in the graph below ``roots`` (the tensors of one backward call, before it runs) that mixes
    ``samples`` samples: the layer whose output it reshapes (``owner`` names a graph node's layer, None for a node
    that is not a layer's output; "" when none is found near), the shape it was given and the one it made."""
    found = []
    for node in hold(roots, BUDGET):  # each node held, so that ids stay unique while the walk runs
        if type(node).__name__ not in _VIEWS:
            continue
        shapes = _shapes(node)
        if shapes is not None and _mixes(*shapes, samples):
            found.append((_producer(node, owner), *shapes))
    return found


def _shapes(node: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The shape a view was given (saved for its backward, as sizes) and the one it made, or None when either is not
    there to read."""
    made = made_shape(node)
    try:
        given = tuple(int(n) for n in node._saved_self_sym_sizes)
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None
    return (given, made) if made is not None else None


def _mixes(given: tuple[int, ...], made: tuple[int, ...], samples: int) -> bool:
    if samples < 2 or len(given) < 2 or not made or made[0] != samples or given[0] == samples:
        return False
    if any(math.prod(made[:j]) == given[0] for j in range(2, len(made) + 1)):
        # the result's first axes split the input's first one, which holds the samples merged with another axis:
        # a Linear's (N * T, H) output given back its (N, T, H), whose H may be as long as the batch
        return False
    if any(math.prod(given[:k]) == made[0] for k in range(2, len(given))):
        # the result's first axis merges the input's first ones: (T, B, H) flattened to (T * B, H), scored per
        # position, whose H may be as long as the T * B targets
        return False
    for axis in range(1, len(given)):
        if given[axis] == samples:
            return math.prod(given[:axis]) > 1
    return False


def _producer(node: object, owner: Callable[[object], tuple[str, bool] | None]) -> str:
    """The layer whose output the view reshapes: the nearest layer output below it (first inputs first)."""
    frontier = [n for n, _ in getattr(node, "next_functions", ()) if n is not None]
    for _ in range(NEAR):
        after: list[object] = []
        for below in frontier:
            found = owner(below)
            if found is not None:
                return found[0]
            after.extend(n for n, _ in getattr(below, "next_functions", ()) if n is not None)
        frontier = after
    return ""
