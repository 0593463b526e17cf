"""Dropout the forward code applies itself, read from the loss's autograd graph before the backward pass frees it.

``nn.Dropout`` modules are read from the model when the debugger attaches (:mod:`neuraldbg.model.layers`); a
``F.dropout(x, p, training=...)`` in ``forward`` (a graph convolution's, a hand-written attention's) or an inverted
dropout written by hand (``mask = (torch.rand_like(h) < keep) / keep; h = h * mask``) is no module, and shows only
in the graph of the passes it ran in:

* on a CPU (and for a hand-written one anywhere) as a ``MulBackward0`` whose saved factor is the mask: every value 0
  or ``c = 1 / (1 - p)``, the share of zeros close to ``p``, the factor not learned (a learned gate is none). A 0/1
  mask (``c = 1``) is not judged: a fixed pruning mask or a padding mask looks the same; so a mask multiplied in
  and scaled apart (``h * mask / keep``) is not either. A weighting of ``c`` with zeros elsewhere (a padding mask
  times a loss weight) has its share of zeros unrelated to ``1 - 1 / c``;
* through ``torch.native_dropout`` (the GPU's dropout kernel) as a ``NativeDropoutBackward0`` that saved ``p`` itself.

Cost: on the first :data:`PASSES` fully observed backward passes only (of the loss checks' passes), a look at the
first :data:`BUDGET` of the graph's nodes the loss checks already hold (no walk of its own) and, for at most
:data:`CANDIDATES` masks, three reductions each over at most :data:`SAMPLE` of its elements, left on the device as one
0-d tensor (read at the flush).
"""

from __future__ import annotations

import torch
from torch import Tensor

#: The first fully observed backward passes looked at (a dropout in the code runs on every training pass).
PASSES = 2
#: Graph nodes looked at per pass.
BUDGET = 4096
#: Masks judged per pass (the first met from the loss).
CANDIDATES = 16
#: A mask of fewer elements says too little about its rate (feature dropout's ``(batch, channels, 1, 1)`` masks of a
#: small batch are left out).
MIN_ELEMENTS = 64
#: A mask is judged on a strided sample of at most this many of its elements.
SAMPLE = 1 << 16
#: How far the share of zeros may lie from the rate its scale says (a binomial share of 64 elements at p = 0.9 has a
#: standard deviation of 0.0375).
TOLERANCE = 0.1


def heaviest(nodes: list[object]) -> tuple[float | None, Tensor | None]:
    """The largest dropout rate among the graph ``nodes`` of one backward call (:func:`~.loss_graph.hold`'s, from its
    roots; the first :data:`BUDGET` looked at): the largest one a node holds as a number (None when none does), and
    a 0-d tensor on the device holding the largest rate among the masks multiplied in (0 when none is one; None when
    no product was a candidate)."""
    known: float | None = None
    masks: list[Tensor] = []
    for node in nodes[:BUDGET]:
        name = type(node).__name__
        if name == "NativeDropoutBackward0":
            p = getattr(node, "_saved_p", None)
            if isinstance(p, float) and 0.0 < p < 1.0:
                known = p if known is None else max(known, p)
        elif name == "MulBackward0" and len(masks) < CANDIDATES:
            mask = _mask_factor(node)
            if mask is not None:
                masks.append(mask)
    return known, _mask_rates(masks) if masks else None


def _mask_factor(node: object) -> Tensor | None:
    """The saved factor of a product by something that needs no gradient (a learned gate is no mask), when it may be
    a dropout mask."""
    try:
        other = getattr(node, "_saved_other", None)
    except RuntimeError:  # freed (a graph kept from an earlier pass)
        return None
    if type(other) is not Tensor or other.requires_grad:  # a plain tensor (no subclass), not learned
        return None
    if not other.is_floating_point() or other.layout is not torch.strided or other.numel() < MIN_ELEMENTS:
        return None
    return other


def _mask_rates(masks: list[Tensor]) -> Tensor:
    """The largest dropout rate among ``masks``, as a 0-d float tensor: a mask's is ``1 - 1 / c`` when its values are
    all 0 or ``c > 1`` and its share of zeros lies within :data:`TOLERANCE` of that; 0 for any other factor. Three
    reductions a mask, on at most :data:`SAMPLE` of its elements (its largest value, its zeros, the values equal to
    the largest), judged together."""
    with torch.no_grad():
        counts = []
        sizes = []
        for mask in masks:
            flat = mask.detach().reshape(-1)
            flat = flat[:: -(-flat.numel() // SAMPLE)]  # a strided sample: a dropout's mask is alike everywhere
            top = flat.amax()
            counts.append(torch.stack([top.float(), (flat == 0).sum().float(), (flat == top).sum().float()]))
            sizes.append(float(flat.numel()))
        top, zeros, tops = torch.stack(counts).unbind(1)
        size = torch.tensor(sizes, device=top.device)
        rate = 1 - 1 / top.clamp(min=1.0)
        two_valued = (zeros + tops == size) & (top > 1)
        consistent = (zeros / size - rate).abs() <= TOLERANCE
        found = torch.where(two_valued & consistent, rate, torch.zeros_like(rate)).amax()
        return torch.where(torch.isfinite(found), found, torch.zeros_like(found))
