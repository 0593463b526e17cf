"""Attention the module hooks do not see, found in the loss's graph: ``F.scaled_dot_product_attention`` and an
attention written by hand (``softmax(q @ k.transpose(-2, -1) * scale) @ v``), as a self-attention that lets a
position see the later ones.

What ``missing_causal_mask`` needs from a model that is not built on ``nn.MultiheadAttention`` (a nanoGPT- or
LLaMA-style block calling ``F.scaled_dot_product_attention`` without ``is_causal=True``, or masking its scores
with a mask it never applies, or applies the wrong way round). Read once per fully observed pass, before its
backward call, on the first few passes whose model was given one sequence of token ids (see
:data:`~neuraldbg.capture.forward.GRAPH_CAUSAL_CHECKS`): a walk of the graph below the next-token objective's
``nll_loss`` (at most :data:`BUDGET` nodes; an attention that feeds another head alone is not below it),
attributes and shapes, and the boolean masks a hand-written attention saved, looked at without unpacking them
(see :func:`_saved`: under activation checkpointing an unpack would run the block's forward again).

An attention counts when its keys are as many as the tokens, its queries as many as its keys, and:

- a fused kernel's node (``ScaledDotProduct...Backward0``) saved ``is_causal`` False and no mask or bias;
- a fused kernel's node given a mask (``attn_mask=``, which torch saves as scores to add: a boolean one as 0 and
  -inf) whose entries above the diagonal do not all hide their key (at most :data:`~neuraldbg.stats.tensors.
  HIDDEN_SCORE`): a mask of zeros (a 4-d padding mask with no causal part), or one the wrong way round;
- a hand-written one (or torch's own attention computed in plain operations): a softmax over the last axis whose
  input is the product of queries and keys, scaled by one number at most, whose probabilities reach the product
  with the values through reshapes, dropout (on a CPU, a product by its mask), other products by a constant (a 0/1
  mask applied after the softmax, whose normaliser took in the later keys) and ``nan_to_num`` only. Between the
  product and the softmax, ``tril`` (which leaves 0, still weighed) hides nothing, and a ``masked_fill`` or
  ``where`` is read for the positions it hides: one that hides every later key (the usual causal mask) is a mask,
  one that does not (the mask inverted) is none. A mask or bias added to the scores (ALiBi, a float ``tril`` of
  ones, Hugging Face's extended mask) is judged by what it did: the softmax's probabilities (which it saved) give a
  later key a weight of at least :data:`LATER_WEIGHT` somewhere, or not. Anything else there, or after the
  softmax, is not judged;
- a hand-written one whose softmax runs over the queries' axis (``softmax(dim=-2)``) of a square product of
  queries and keys: whatever its mask, each position's weights are divided by a sum over every query, the later
  positions' included, which see their own targets (reported as a leak through the queries);

and its queries and keys are a self-attention's: both come, within :data:`NEAR` graph nodes reached position by
position (not through a reduction, a pooling, a convolution or another attention), from one node that depends on
the data (the fused projection a nanoGPT block splits, the normalised stream two projections read, before their
rotary embeddings). Keys from a memory (an image's patches, an encoder's states) do not meet the queries so,
whatever their length; values made of parameters alone that both sides read (one positional table, sliced or
looked up at ``torch.arange``, one projection's weight split in three) are not data and do not count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from ..stats import tensors as stats
from .loss_graph import made_shape

#: Graph nodes walked below the loss, at most.
BUDGET = 50_000
#: Graph nodes from the queries and from the keys within which both must meet one node that depends on the data.
NEAR = 16

_PRODUCTS = frozenset({"BmmBackward0", "MmBackward0"})
#: Nodes that move or copy values without mixing positions: between the scores' product and the softmax, and
#: between the softmax and the product with the values.
_RESHAPES = frozenset(
    {
        "ViewBackward0",
        "UnsafeViewBackward0",
        "ReshapeAliasBackward0",
        "CloneBackward0",
        "ExpandBackward0",
        "TransposeBackward0",
        "PermuteBackward0",
        "SqueezeBackward0",
        "SqueezeBackward1",
        "UnsqueezeBackward0",
        "ToCopyBackward0",
    }
)
_SCALES = frozenset({"MulBackward0", "MulBackward1", "DivBackward0", "DivBackward1"})
#: Products by a tensor: between the softmax and the values, by a constant one (see :func:`_by_constant`).
_PRODUCTS_BY = frozenset({"MulBackward0", "MulBackward1"})
#: Nodes that mix positions (by the start of their names): below them, queries and keys are no longer read position
#: by position (see :func:`_near`).
_MIXING = (
    "Mean",
    "Sum",
    "Amax",
    "Amin",
    "Max",
    "Min",
    "Norm",
    "LinalgVectorNorm",
    "Logsumexp",
    "Prod",
    "Var",
    "Std",
    "Cum",
    "Bmm",
    "ScaledDotProduct",
    "Convolution",
    "AvgPool",
    "AdaptiveAvgPool",
    "AdaptiveMaxPool",
    "MaxPool",
)
#: Nodes that set scores to 0, which the softmax still weighs (``att.tril()``): no mask.
_ZEROING = frozenset({"TrilBackward0", "TriuBackward0"})
#: Nodes that hide scores where a boolean mask says (``masked_fill``, ``where``): read, see :func:`_hidden`.
_MASKING = frozenset({"MaskedFillBackward0", "WhereBackward0"})
#: Nodes between the softmax and the product with the values that keep each weight where it was: dropout, and a
#: ``nan_to_num`` (a row whose every key was hidden gives NaN).
_DROPOUTS = frozenset({"NativeDropoutBackward0", "NanToNumBackward0"})
#: A softmax's nodes (``_safe_softmax``: the one torch's own attention computes in plain operations).
_SOFTMAXES = frozenset({"SoftmaxBackward0", "SafeSoftmaxBackward0"})
#: Nodes that add a mask or a bias to the scores: judged by the probabilities the softmax made (see _weighs_later).
_ADDING = frozenset({"AddBackward0", "SubBackward0"})
#: A later key given at least this weight by some query is seen (an added -1e4, -1e9 or -inf leaves it exactly 0 in
#: float32; a soft -10 leaves it e^-10 of what it was, at most 4.5e-5).
LATER_WEIGHT = 1e-3
#: How an attention lets a position see the later ones (see :func:`unmasked`): no mask hides them, or its softmax
#: runs over the queries, whose sums take in the later positions whatever the mask.
NO_MASK = "no mask"
OVER_QUERIES = "over queries"


def unmasked(
    roots: list[object],
    lengths: set[int],
    owner: Callable[[object], tuple[str, bool] | None],
    rows: Tensor | None = None,
) -> list[tuple[str, str]]:
    """Every self-attention with no mask over as many keys as one of ``lengths`` (the token input's axes, batch
    first or not) in the graph below ``roots`` (graph nodes of one backward call, before it runs: the next-token
    objective's ``nll_loss``, so that an attention feeding another head alone is not read), as ``(layer, how)``:
    ``how`` is :data:`NO_MASK`, or :data:`OVER_QUERIES` for a softmax over the queries' axis. ``owner`` names the
    layer a graph node is the output of, and whether that layer holds submodules (None for a node that is not a
    layer's output): an attention is named by the nearest such layer above it, whose code runs it (``h.0.attn``,
    not its ``c_proj`` given the result; a layer without submodules, the nearest one when no layer above holds
    any). An empty name: none was found. ``rows`` (one boolean per position): the queries whose targets the loss
    scores, the only ones a mask must hide the later keys from (a prefix LM's unscored prefix sees all of itself)."""
    found: list[tuple[str, str]] = []
    parents: dict[int, object] = {}
    for node, parent in _walk(roots):
        if parent is not None:
            parents.setdefault(id(node), parent)
        seen = _attention(node, lengths, rows)
        if seen is not None and _meet(seen[0], seen[1]):
            found.append((_name(node, parents, owner), seen[2]))
    return found


def _walk(roots: list[object]) -> Iterator[tuple[object, object | None]]:
    queue: list[tuple[object, object | None]] = [(node, None) for node in roots]
    seen = {id(node): node for node, _ in queue}  # held while the walk runs (ids stay unique)
    at = 0
    while at < len(queue) and at < BUDGET:
        node, parent = queue[at]
        at += 1
        yield node, parent
        for nxt, _ in getattr(node, "next_functions", ()):
            if nxt is not None and id(nxt) not in seen:
                seen[id(nxt)] = nxt
                queue.append((nxt, node))


def _attention(node: object, lengths: set[int], rows: Tensor | None) -> tuple[object, object, str] | None:
    """The nodes of the queries and of the keys of an unmasked attention over one of ``lengths`` keys whose result
    ``node`` is, and how it is unmasked (see :func:`unmasked`), else None."""
    name = type(node).__name__
    inputs = [n for n, _ in getattr(node, "next_functions", ())]
    if name.startswith("ScaledDotProduct"):
        return _fused(node, inputs, lengths, rows)
    if name in _PRODUCTS and len(inputs) == 2 and inputs[0] is not None:
        return _written(inputs[0], lengths, rows)
    return None


def _fused(
    node: object, inputs: list[object], lengths: set[int], rows: Tensor | None
) -> tuple[object, object, str] | None:
    if len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
        return None
    if getattr(node, "_saved_is_causal", True) is not False:
        return None
    query, key = _shape(node, 0), _shape(node, 1)
    if query is None or key is None or len(query) < 2 or len(key) < 2:
        return None
    if key[-2] not in lengths or query[-2] != key[-2]:
        return None
    for attribute in dir(node):
        if not attribute.startswith("_raw_saved_"):
            continue
        name = attribute[len("_raw_saved_") :]
        if "bias" in name:
            if _saved(node, name) is not None:
                return None  # a bias (or one that cannot be looked at): not judged
        elif "mask" in name:
            mask = _saved(node, name)
            if mask is None:
                continue
            if not isinstance(mask, Tensor) or mask.dim() < 2 or mask.shape[-1] != key[-2]:
                return None  # a mask that cannot be looked at, or not laid out over these keys: not judged
            if stats.hides_later(stats.hidden_positions(mask, attend_is_one=False), rows):
                return None  # masked
    return inputs[0], inputs[1], NO_MASK


def _written(probabilities: object, lengths: set[int], rows: Tensor | None) -> tuple[object, object, str] | None:
    """``probabilities``: the first input of a product; the queries' and keys' nodes when it is an unmasked
    softmax of their scaled product over one of ``lengths`` keys, as many queries (or a softmax of that product
    over the queries, masked or not), and how it is unmasked."""
    node: object | None = probabilities
    while node is not None and type(node).__name__ not in _SOFTMAXES:
        if type(node).__name__ in _RESHAPES or type(node).__name__ in _DROPOUTS:
            node = _first(node)
        else:
            node = _by_constant(node)
    if node is None:
        return None
    softmax = node
    dim = getattr(node, "_saved_dim", None)
    result = made_shape(node)
    if not isinstance(dim, int) or result is None or len(result) < 2:
        return None
    if dim >= 1 << 63:  # -1 read back as an unsigned 64-bit number
        dim -= 1 << 64
    queries = dim in (-2, len(result) - 2)
    if dim not in (-1, len(result) - 1) and not queries:
        return None
    if result[-1] not in lengths or result[-2] != result[-1]:
        return None
    added = False
    node = _first(node)
    while node is not None:
        name = type(node).__name__
        if name in _RESHAPES or name in _ZEROING or _scalar_scale(node):
            node = _first(node)
        elif name in _MASKING:
            hidden = _hidden(node)
            if hidden is None or hidden.shape[-1:] != (result[-1],):
                return None  # masked in a way not read
            if stats.hides_later(hidden, rows) and not queries:
                return None  # masked
            node = _scores(node)
        elif name in _ADDING:
            added = True
            node = _added_to(node)
        else:
            break
    if type(node).__name__ not in _PRODUCTS:
        return None
    inputs = [n for n, _ in getattr(node, "next_functions", ())]
    if len(inputs) != 2 or inputs[0] is None or inputs[1] is None:
        return None
    if queries:
        return inputs[0], inputs[1], OVER_QUERIES
    if added and not _weighs_later(softmax, result[-1], rows):
        return None  # what was added hides the later keys (or the probabilities cannot be looked at)
    return inputs[0], inputs[1], NO_MASK


def _by_constant(node: object) -> object | None:
    """The input of a product by a tensor with no graph (a CPU dropout's mask, which its ``MulBackward0`` saved; a
    number; a 0/1 mask applied after the softmax, whose normaliser still took in the later keys), that keeps each
    weight where it was; None for any other node."""
    if type(node).__name__ not in _PRODUCTS_BY:
        return None
    inputs = [n for n, _ in getattr(node, "next_functions", ())]
    given = [n for n in inputs if n is not None]
    return given[0] if len(given) == 1 else None


def _added_to(node: object) -> object | None:
    """The input of an addition (or subtraction) to the scores that carries them: the one that reaches the product
    of queries and keys through reshapes and scales (the other is the mask or the bias: a constant, or computed
    from a learnt table); None when neither or both do."""
    inputs = [n for n, _ in getattr(node, "next_functions", ()) if n is not None]
    reaching = [n for n in inputs if _reaches_product(n)]
    return reaching[0] if len(reaching) == 1 else None


def _reaches_product(node: object | None) -> bool:
    """Whether ``node`` is the product of queries and keys, or reaches it through reshapes and scales."""
    for _ in range(NEAR):
        if node is None:
            return False
        name = type(node).__name__
        if name in _PRODUCTS:
            return True
        if not (name in _RESHAPES or _scalar_scale(node)):
            return False
        node = _first(node)
    return False


def _weighs_later(softmax: object, length: int, rows: Tensor | None) -> bool:
    """Whether the probabilities a softmax over ``length`` keys saved give some later key (above the diagonal of
    their last two axes; in the queries of ``rows`` only, when given) a weight of at least :data:`LATER_WEIGHT`: the
    mask or bias added before it hid nothing. False when they cannot be looked at (not judged). Reads them: one
    value to the host."""
    weights = _saved(softmax, "result")
    if not isinstance(weights, Tensor) or weights.dim() < 2 or weights.shape[-2:] != (length, length):
        return False
    with torch.no_grad():
        top = weights.detach()
        if top.dim() > 2:  # the largest over the batch and the heads: one grid, not a copy of all of them
            top = top.reshape(-1, length, length).amax(0)
        return bool((top[stats.later_keys(length, rows, weights.device)] >= LATER_WEIGHT).any())


def _hidden(node: object) -> Tensor | None:
    """Which scores a ``masked_fill`` or a ``where`` between the scores and the softmax hides (True: hidden), from
    the mask it saved; None when it cannot be read. A ``where(keep, scores, -inf)`` hides where ``keep`` is False,
    a ``where(hide, -inf, scores)`` where ``hide`` is True: which input the scores are tells them apart."""
    if type(node).__name__ == "MaskedFillBackward0":
        mask = _saved(node, "mask")
        return mask if isinstance(mask, Tensor) and mask.dtype is torch.bool else None
    condition = _saved(node, "condition")
    if not isinstance(condition, Tensor) or condition.dtype is not torch.bool:
        return None
    inputs = [n for n, _ in getattr(node, "next_functions", ())]
    if len(inputs) != 2 or (inputs[0] is None) == (inputs[1] is None):
        return None  # scores on both sides, or on neither: not a mask applied to them
    return ~condition if inputs[0] is not None else condition


def _scores(node: object) -> object | None:
    """The input of a ``masked_fill`` or a ``where`` that carries the scores."""
    inputs = [n for n, _ in getattr(node, "next_functions", ())]
    return next((n for n in inputs if n is not None), None)


def _scalar_scale(node: object) -> bool:
    """A product or quotient by one number (a score's ``1 / sqrt(d)``), not by a mask or another tensor."""
    if type(node).__name__ not in _SCALES:
        return False
    inputs = [n for n, _ in getattr(node, "next_functions", ())]
    if len(inputs) == 2 and inputs[1] is not None:
        return False  # by a tensor that is itself computed (a learnt temperature is a parameter: still one number)
    other = _saved(node, "other")
    if other is _UNREAD:
        return False
    return other is None or not isinstance(other, Tensor) or other.numel() == 1


#: What :func:`_saved` gives for a saved tensor it will not look at.
_UNREAD = object()


def _saved(node: object, name: str) -> object:
    """What ``node`` saved as ``name`` for its backward pass, looked at without unpacking it: the tensor, None for
    none, and :data:`_UNREAD` when saved-tensor hooks hold it (non-reentrant activation checkpointing, offloading),
    whose unpacking would run their code (a checkpointed block's forward again, its layers' hooks with it) or a
    tensor already freed. A value that is no tensor (a dimension, a flag) is read as it is."""
    raw = getattr(node, "_raw_saved_" + name, None)
    if raw is None:
        try:
            return getattr(node, "_saved_" + name, None)
        except RuntimeError:
            return _UNREAD
    try:
        if getattr(raw, "unpack_hook", None) is not None:
            return _UNREAD
        data = raw.data  # the tensor itself, not unpacked (with hooks: what they packed)
    except RuntimeError:  # freed by a backward pass already run
        return _UNREAD
    return data if data is None or isinstance(data, Tensor) else _UNREAD


def _shape(node: object, index: int) -> tuple[int, ...] | None:
    """The shape of a node's ``index``-th input (its producer's output), as autograd records it."""
    inputs = getattr(node, "next_functions", ())
    if index >= len(inputs) or inputs[index][0] is None:
        return None
    producer, at = inputs[index]
    return made_shape(producer, at)


def _first(node: object) -> object | None:
    inputs = getattr(node, "next_functions", ())
    return inputs[0][0] if inputs else None


def _near(start: object) -> dict[int, object]:
    """The nodes within :data:`NEAR` steps below ``start`` that depend on the data, reached position by position:
    the walk does not go below a node that mixes positions (a reduction, a pooling, a convolution, a product of two
    data tensors, an attention). A captioner that adds its image's pooled feature to its tokens reaches the image's
    patches from its queries only through that pooling; the keys of its cross-attention are those patches."""
    found: dict[int, object] = {}
    frontier = [start]
    for _ in range(NEAR):
        after: list[object] = []
        for node in frontier:
            if id(node) in found or type(node).__name__ == "AccumulateGrad":
                continue
            if _data(node):
                found[id(node)] = node
            if not type(node).__name__.startswith(_MIXING):
                after.extend(n for n, _ in getattr(node, "next_functions", ()) if n is not None)
        frontier = after
    return found


def _data(node: object) -> bool:
    """Whether a node's value depends on more than parameters (see :func:`_fixed`)."""
    return not _fixed(node)


def _fixed(node: object, depth: int = 0) -> bool:
    """Whether a node's value is the same for every sample, computed from parameters alone: every input of it a
    parameter or such a value (reshapes, slices and splits of parameters: one projection's weight split in three, as
    ``nn.MultiheadAttention`` splits its ``in_proj_weight``, which both sides of a cross-attention read; sums of
    positional tables), or a lookup of a table at indices with no batch of their own (a positional embedding's
    ``pos(torch.arange(T))``, which a captioner may add to its tokens and to its image's patches alike). An input
    with no graph (data, or a number) makes a node not fixed."""
    name = type(node).__name__
    if name == "AccumulateGrad":
        return True
    inputs = [n for n, _ in getattr(node, "next_functions", ())]
    if depth > NEAR or not inputs or any(n is None for n in inputs):
        return False
    if name == "EmbeddingBackward0" and not _batch_free(node):
        return False  # tokens looked up: data
    return all(_fixed(n, depth + 1) for n in inputs)


def _batch_free(node: object) -> bool:
    """An embedding lookup whose indices hold one row for every sample: 1-d, one row, or one row broadcast."""
    indices = _saved(node, "indices")
    if not isinstance(indices, Tensor):
        return False
    return indices.dim() < 2 or indices.shape[0] == 1 or indices.stride(0) == 0


def _meet(query: object, key: object) -> bool:
    return not _near(query).keys().isdisjoint(_near(key).keys())


def _name(node: object, parents: dict[int, object], owner: Callable[[object], tuple[str, bool] | None]) -> str:
    at: object | None = node
    first = ""
    for _ in range(256):
        at = parents.get(id(at))
        if at is None:
            break
        found = owner(at)
        if found is not None:
            if found[1]:
                return found[0]
            first = first or found[0]
    return first
