"""What the loss's autograd graph says about the model output it was computed from: whether the loss normalises
logits itself (``cross_entropy`` and ``nll_loss`` after ``log_softmax``, ``binary_cross_entropy_with_logits``: a
classifier's loss), and whether it was given values an activation already squashed or cut (a softmax, a ReLU, a
sigmoid) instead of raw logits.

Read from the graph's node types alone, once a backward pass that reached the model is done (the loss still holds
its graph): a walk of at most :data:`BUDGET` nodes from the loss towards the model, which stops at the first such
loss node and looks through the nodes that only reshape a tensor (a view, a transpose, ``contiguous``) to the node
that produced its input. No tensor value is read and nothing runs on the device. The node objects are compared by
identity only while the graph is alive, never kept. The reduction of the loss node above the normalising node
(``nll_loss``'s, or ``binary_cross_entropy_with_logits``' own) is read from the node's saved attribute, a Python
integer: a mean makes the loss one sample's, so its first value can be held against log(classes). So is the
``ignore_index`` of an ``nll_loss`` node: a token id the loss leaves out (a padding token's, when it is one). And
whether the logits are cosine similarities times a scale (:func:`scaled_cosine`: ArcFace, CosFace, CLIP, NT-Xent),
whose size is the scale the user chose, not anything the layers' initialisation did.

:func:`regression` walks the same way, before the backward pass frees the graph's saved tensors, to the first mean
squared error: the target that MSE node saved, handed on to be profiled on the device (is it a handful of integer
values?) and then dropped, never kept; so does :func:`bounded_prediction`, for a loss by value on the output of
an activation whose range may not hold the targets. :func:`log_probabilities` does the same for the input of an
``nll_loss`` that no ``log_softmax`` produced: are those values log-probabilities at all? And :func:`class_labels`
for the class indices an ``nll_loss`` saved: how often each class is a label (the chance level of a classifier
whose classes are imbalanced). And :func:`loss_targets` for the targets of a binary cross-entropy or a mean squared
error that is the loss itself (its mean): their base rates or variances are that loss's chance level. And
:func:`crossed` for a loss that compares each sample's prediction with every other sample's target: a prediction
of shape ``(N, 1)`` against a target of ``(N,)``, broadcast to ``(N, N)``, read from shapes alone (the loss node's
saved sizes, the shapes autograd records of each node's output). And :func:`sample_targets` for the shape of a
loss's targets when they are one per sample: how many samples the loss scores.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from ..stats import tensors as stats

#: Graph nodes looked at from the loss, at most (a loss node is a few nodes from the loss: a mean, a weight).
BUDGET = 64
#: Nodes that take logits and normalise them themselves: the loss function they belong to.
NORMALISING = {
    "LogSoftmaxBackward0": "cross_entropy / nll_loss(log_softmax)",
    "BinaryCrossEntropyWithLogitsBackward0": "binary_cross_entropy_with_logits",
}
#: Nodes whose output is what their input was, reshaped or copied (looked through).
SHAPE_ONLY = frozenset(
    {
        "ViewBackward0",
        "UnsafeViewBackward0",
        "ReshapeAliasBackward0",
        "TransposeBackward0",
        "TransposeBackward1",
        "PermuteBackward0",
        "SqueezeBackward0",
        "SqueezeBackward1",
        "SqueezeBackward2",
        "UnsqueezeBackward0",
        "CloneBackward0",
        "ToCopyBackward0",
        "AliasBackward0",
        "ExpandBackward0",
        "SelectBackward0",
        "SliceBackward0",
    }
)
#: Activations whose output is no logit: what each does to it.
ACTIVATIONS = {
    "SoftmaxBackward0": "softmax",
    "ReluBackward0": "ReLU",
    "SigmoidBackward0": "sigmoid",
}
#: Reshaping nodes looked through, at most.
_HOPS = 8
#: Nodes that pick some of their input's values, unchanged (a Q-network's value of the action taken, a mask).
_SELECTING = frozenset({"GatherBackward0", "IndexBackward0", "MaskedSelectBackward0", "TakeBackward0"})
#: The nodes of ``nll_loss`` (a batch of vectors; images and sequences).
_NLL = frozenset({"NllLossBackward0", "NllLoss2DBackward0"})
#: ``ctc_loss``: like ``nll_loss``, it takes log-probabilities and does not normalise them.
_CTC = "CtcLossBackward0"
#: ``binary_cross_entropy`` (``nn.BCELoss``): it takes probabilities as they are.
_BCE = "BinaryCrossEntropyBackward0"
#: Clamps, with bounds given as numbers or tensors, or one bound only.
_CLAMPS = frozenset({"ClampBackward0", "ClampBackward1", "ClampMinBackward0", "ClampMaxBackward0"})
#: Losses that compare a prediction with its target value by value, and their names in words.
_BY_VALUE_NAMES = {
    "MseLossBackward0": "mse_loss",
    "SmoothL1LossBackward0": "smooth_l1_loss",
    "HuberLossBackward0": "huber_loss",
}
_BY_VALUE = frozenset(_BY_VALUE_NAMES)
#: Activations whose outputs are bounded: their name, and the values they can take (low, high).
BOUNDED = {
    "ReluBackward0": ("ReLU", 0.0, math.inf),
    "SoftplusBackward0": ("softplus", 0.0, math.inf),
    "SigmoidBackward0": ("sigmoid", 0.0, 1.0),
    "TanhBackward0": ("tanh", -1.0, 1.0),
}
#: The node of ``mse_loss`` (``nn.MSELoss``) and the code of its ``reduction="mean"``.
_MSE = "MseLossBackward0"
_MEAN = 1
#: Loss nodes that reduce the per-sample losses of a normalised input, and torch's code for a mean reduction.
_REDUCING = frozenset({"NllLossBackward0", "NllLoss2DBackward0", "BinaryCrossEntropyWithLogitsBackward0"})
#: ``ignore_index`` is saved as an unsigned 64-bit integer: torch's default, -100, reads 2**64 - 100.
_WRAP = 1 << 64
#: Matrix products: a cosine similarity's, when both operands are normalised.
_PRODUCTS = frozenset({"MmBackward0", "BmmBackward0"})
#: Element-wise nodes between cosine similarities and the logits made of them that keep the logits within the
#: scale's bounds: the scale or temperature itself (a product or quotient with a constant, or with a learnable
#: scalar through exp and a clamp), a margin (ArcFace's ``cos(acos(x) + m)``, or the same angle sum written
#: ``x cos m - sqrt(1 - x^2) sin m``; CosFace's ``x - m``; chosen for the labels' class by a ``where``), clamping,
#: masking, gathering the similarities of several views.
_SCALING = frozenset(
    {
        "MulBackward0",
        "DivBackward0",
        "WhereBackward0",
        "CosBackward0",
        "AcosBackward0",
        "SqrtBackward0",  # sqrt(1 - cos^2): the sine of the angle
        "PowBackward0",  # a tensor to a constant power (cos ** 2)
        "RsubBackward1",  # a constant minus a tensor (1 - cos^2)
        "AddBackward0",
        "SubBackward0",
        "NegBackward0",
        "ClampBackward1",
        "ClampMinBackward0",
        "ClampMaxBackward0",
        "ExpBackward0",
        "MaskedFillBackward0",
        "CatBackward0",
        "TBackward0",
        "IndexBackward0",
    }
)
#: A scale's nodes beside a normalised tensor: a learnable scalar, or its exp.
_SCALARS = frozenset({"AccumulateGrad", "ExpBackward0"})
#: What a vector norm's node is called (``F.normalize`` divides by it, clamped at eps and expanded).
_NORMS = frozenset({"LinalgVectorNormBackward0", "NormBackward0", "NormBackward1"})
#: Nodes looked at below the logits for :func:`scaled_cosine`, at most.
_COSINE_BUDGET = 48


@dataclass(frozen=True, slots=True)
class ActivatedInput:
    """A loss that normalises its input, given an activation's output. ``node`` and ``below`` are the identities
    of the activation's graph node and of the node of its input (to name the layers whose outputs they are)."""

    loss: str
    activation: str
    node: int
    below: int


@dataclass(frozen=True, slots=True)
class Regression:
    """A mean squared error (mean reduction) whose target holds one value per sample: the target it saved (to be
    profiled by the caller, then dropped; one value per sample) and how many samples the prediction holds.
    ``outputs`` > 1: the prediction holds that many values per sample and the one target was broadcast across them
    (``mse_loss(logits, labels.float().unsqueeze(1))``), each compared with it; ``node``: the identity of the graph
    node that produced the prediction then (to name the layer whose output it is)."""

    target: Tensor
    samples: int
    outputs: int = 1
    node: int = 0


@dataclass(frozen=True, slots=True)
class LossGraph:
    """What one backward call's graph says: the loss that normalises logits it found (``""``: none), the
    activation before it, if any, and whether the value the backward pass starts from is that loss averaged over
    its samples (False: a sum, no reduction, a loss node not recognised between it and the backward call's root,
    or a loss that is more than that one term: other terms added to it, a weight, several roots, as in
    knowledge distillation's ``T**2 * KL + CE``)."""

    loss: str
    activated: ActivatedInput | None
    mean: bool = False
    ignored: int | None = None  # the ``ignore_index`` of that loss when it names a token id (>= 0)
    cosine: bool = False  # the logits are cosine similarities times a scale (see scaled_cosine)
    smoothed: bool = False  # a label-smoothed cross-entropy (its chance level is log(classes), not the labels')
    mixture: bool = False  # a log_softmax met under a logsumexp: a mixture's weights, marginalised


def _weighted(node: object) -> bool:
    """A ``binary_cross_entropy_with_logits`` node given a ``pos_weight`` or a ``weight``: its mean is over weighted
    terms (not normalised by the weights, as ``cross_entropy``'s is), so its value at zero logits is log 2 times the
    weights, not one sample's loss at chance (a multi-label loss with ``pos_weight=10``: 3.3 log(classes) at a
    sound initialisation). An attribute read: nothing is computed. Read after the backward pass, a saved tensor
    is freed and reading it raises, while one never given reads as None: the raise says it was given."""
    if type(node).__name__ != "BinaryCrossEntropyWithLogitsBackward0":
        return False
    for attribute in ("_saved_pos_weight", "_saved_weight"):
        try:
            if getattr(node, attribute, None) is not None:
                return True
        except RuntimeError:  # freed: it was a tensor
            return True
    return False


def hold(losses: list[Tensor], most: int = 1 << 17) -> list[object]:
    """Every graph node below ``losses`` (at most ``most``), to be kept while readings of this graph compare nodes by
    identity. A node's Python object is made on demand and, in some torch releases (2.11), dropped as soon as nothing
    holds it: another object may take its id, and the next look at the same node makes a new one. While this list
    lives, each node keeps one object and one id. The walks below key what they have seen by id the same way, the
    node as the value, so it lives while they run."""
    seen: dict[int, object] = {}
    for root in [t.grad_fn for t in losses if t.grad_fn is not None][:most]:
        seen[id(root)] = root
    queue = list(seen.values())
    while queue:
        for nxt, _ in getattr(queue.pop(), "next_functions", ()):
            if nxt is not None and id(nxt) not in seen:
                if len(seen) >= most:
                    return list(seen.values())
                seen[id(nxt)] = nxt
                queue.append(nxt)
    return list(seen.values())


def made_shape(node: object, index: int = 0) -> tuple[int, ...] | None:
    """The shape of a graph node's ``index``-th forward output, as autograd records it for the gradient it will be
    given (no saved tensor is unpacked); None when it is not there to read."""
    try:
        return tuple(int(n) for n in node._input_metadata[index].shape)  # type: ignore[attr-defined]
    except (AttributeError, IndexError, RuntimeError, TypeError):
        return None


def _walk(losses: list[Tensor]) -> Iterator[tuple[object, object]]:
    """``(node, the node whose input it is)`` from the roots of one backward call towards the model, breadth first,
    at most :data:`BUDGET` nodes, each once; the walk does not go below a node that normalises logits (the model
    lies there). The first nodes come with None."""
    queue: list[tuple[object, object]] = [(t.grad_fn, None) for t in losses if t.grad_fn is not None]
    seen = {id(node): node for node, _ in queue}  # by id, each node held while the walk runs (see hold)
    looked = 0
    while queue and looked < BUDGET:
        node, parent = queue.pop(0)
        looked += 1
        yield node, parent
        if type(node).__name__ in NORMALISING:
            continue
        for nxt, _ in getattr(node, "next_functions", ()):
            if nxt is not None and id(nxt) not in seen:
                seen[id(nxt)] = nxt
                queue.append((nxt, node))


def read(losses: list[Tensor]) -> LossGraph:
    """The first loss node that normalises logits, from ``losses`` (the roots of one backward call), and the
    activation between it and the model's logits (see the module docstring)."""
    root: object = losses[0].grad_fn if len(losses) == 1 else None  # the loss's value is its root node's output
    smoothed = _smoothed_nll(root)  # cross_entropy(label_smoothing=...): its nll_loss term stands for it
    root = smoothed or root
    reduced: dict[int, tuple[bool, int | None]] = {}  # node -> (mean, ignored) of the nearest reducing loss node
    # nodes below a logsumexp: a log_softmax there gives a mixture's weights, added to each component's
    # log-density and marginalised (a mixture density network's -logsumexp(log_pi + log N(y; mu, sigma))), not a
    # classifier's log-probabilities of its classes
    mixed: set[int] = set()
    mixture = False
    first = ""
    mean, ignored, cosine = False, None, False
    for node, parent in _walk(losses):
        name = type(node).__name__
        averaged, ignore = reduced.get(id(parent), (False, None))
        if name in _REDUCING:
            averaged = node is root and getattr(node, "_saved_reduction", None) == _MEAN and not _weighted(node)
            ignore = _token(node)
        reduced[id(node)] = (averaged, ignore)
        if name == "LogsumexpBackward0" or id(parent) in mixed:
            mixed.add(id(node))
            mixture = mixture or name in NORMALISING
            continue
        if name in NORMALISING:
            found = _producer(node)
            if not first:
                mean, ignored, cosine = averaged, ignore, scaled_cosine(found)
            first = first or NORMALISING[name]
            if found is not None:
                kind = ACTIVATIONS.get(type(found).__name__)
                if kind is not None:
                    activated = ActivatedInput(NORMALISING[name], kind, id(found), id(_first_input(found)))
                    return LossGraph(
                        NORMALISING[name], activated, averaged, ignore, smoothed=smoothed is not None, mixture=mixture
                    )
    return LossGraph(first, None, mean, ignored, cosine, smoothed is not None, mixture)


#: Nodes of the smoothing term of ``cross_entropy(label_smoothing=eps)`` below its weight: a sum over the classes
#: of the negated log-probabilities, padded positions masked, averaged over the samples.
_SMOOTHING = frozenset(
    {"MulBackward0", "MulBackward1", "DivBackward0", "SumBackward0", "SumBackward1", "MaskedFillBackward0"}
    | {"NegBackward0", "MeanBackward0", "MeanBackward1", "IndexBackward0"}
)


def _smoothed_nll(root: object) -> object | None:
    """The ``nll_loss`` node of a label-smoothed cross-entropy whose graph ``root`` is, else None. torch computes it
    as ``(1 - eps) * nll_loss(log_softmax(x)) + eps * smoothing``, where the smoothing term reads the same
    log_softmax; its mean over the samples is log(classes) at zero logits, as a plain cross-entropy's."""
    if type(root).__name__ != "AddBackward0":
        return None
    inputs = [n for n, _ in getattr(root, "next_functions", ())]
    if len(inputs) != 2 or any(n is None for n in inputs):
        return None
    for nll_side, other in (inputs, inputs[::-1]):
        nll = _first_input(nll_side) if type(nll_side).__name__ in ("MulBackward0", "MulBackward1") else nll_side
        if type(nll).__name__ not in _NLL:
            continue
        log_probs = _first_input(nll)
        node = other
        for _ in range(_HOPS):
            if node is None or type(node).__name__ not in _SMOOTHING:
                break
            node = _first_input(node)
        if node is not None and node is log_probs and type(node).__name__ == "LogSoftmaxBackward0":
            return nll
    return None


def scaled_cosine(logits: object) -> bool:
    """Whether the logits node ``logits`` computes cosine similarities times a scale: every path below it, through
    :data:`_SCALING` nodes, ends at a matrix product of two normalised operands (``F.normalize``: a quotient by a
    clamped vector norm), at a leaf (a learnable scale or margin) or at a constant; no path reaches a layer's
    output. Such logits are bounded by the scale whatever the weights are."""
    queue, seen, products = [logits], {id(logits): logits}, 0  # by id, each node held (see hold)
    while queue:
        node = queue.pop()
        if node is None or type(node).__name__ == "AccumulateGrad":
            continue
        name = type(node).__name__
        inputs = [nxt for nxt, _ in getattr(node, "next_functions", ())]
        if name in _PRODUCTS:
            if not all(_normalised(nxt) for nxt in inputs):
                return False
            products += 1
            continue
        if name not in _SCALING and name not in SHAPE_ONLY:
            return False
        for nxt in inputs:
            if id(nxt) not in seen:
                seen[id(nxt)] = nxt
                queue.append(nxt)
        if len(seen) > _COSINE_BUDGET:
            return False
    return products > 0


def _normalised(node: object) -> bool:
    """Whether ``node`` outputs a normalised tensor, looked at through reshaping and scaling by a scalar: a
    quotient whose divisor is a vector norm (clamped, expanded), as ``F.normalize`` computes it."""
    for _ in range(_HOPS):
        name = type(node).__name__
        if name in SHAPE_ONLY or name == "TBackward0":
            node = _first_input(node)
            continue
        inputs = [nxt for nxt, _ in getattr(node, "next_functions", ())]
        if name == "DivBackward0" and len(inputs) == 2 and _norm_below(inputs[1]):
            return True
        if name in {"MulBackward0", "DivBackward0"} and inputs:  # a scale times a normalised tensor
            tensors = [n for n in inputs if n is not None and type(n).__name__ not in _SCALARS]
            if len(tensors) != 1:
                return False
            node = tensors[0]
            continue
        return False
    return False


def _norm_below(node: object) -> bool:
    """Whether ``node`` is a vector norm, looked at through the clamp and the expansion ``F.normalize`` adds."""
    for _ in range(_HOPS):
        name = type(node).__name__
        if name in _NORMS:
            return True
        if name not in {"ClampMinBackward0", "ExpandBackward0", "ClampBackward1"}:
            return False
        node = _first_input(node)
    return False


def _token(node: object) -> int | None:
    """The ``ignore_index`` a loss node saved, when it is a token id (not torch's default -100, not absent)."""
    value = getattr(node, "_saved_ignore_index", None)
    if not isinstance(value, int):
        return None
    value = value - _WRAP if value >= _WRAP // 2 else value
    return value if value >= 0 else None


def regression(losses: list[Tensor]) -> Regression | None:
    """The first mean squared error met from ``losses`` (the roots of one backward call, before it runs: the
    graph's saved tensors are freed by the backward pass) on one value per sample, or None (see
    :func:`_regression`). The walk stops below a loss node (cross-entropy, MSE): the model lies there."""
    for node, _ in _walk(losses):
        if type(node).__name__ == _MSE:
            return _regression(node)
    return None


@dataclass(frozen=True, slots=True)
class NllInput:
    """The input an ``nll_loss`` saved, when no ``log_softmax`` produced it (to be checked on the device, then
    dropped), and the identity of the graph node that did (to name the layer whose output it is)."""

    values: Tensor
    node: int
    loss: str = "nll_loss"  # or "ctc_loss", whose input is log-probabilities over its last dimension
    direct: int = 0  # the identity of the node right below the loss (a layer's output may be a view of it)
    dim: int = -1  # a log_softmax over another dimension than the classes produced it: that dimension (else -1)


def log_probabilities(losses: list[Tensor]) -> NllInput | None:
    """The input of the first ``nll_loss`` met from ``losses`` (the roots of one backward call, before it runs),
    unless a ``log_softmax`` over the classes produced it (``cross_entropy``, ``nll_loss(log_softmax(x, 1))``:
    log-probabilities by construction): ``nll_loss`` only picks and negates the target's entry, so its input must
    already be log-probabilities, which the caller checks from the values (``log(softmax(x))`` or ``x -
    logsumexp(x)`` are; raw logits are not, nor a ``log_softmax`` over the batch, ``dim=0``)."""
    for node, _ in _walk(losses):
        name = type(node).__name__
        if name in _NLL or name == _CTC:
            below = _producer(node)
            if below is not None and name in _NLL and type(below).__name__ == "LogSoftmaxBackward0":
                return _across(node, below)
            if below is None or type(below).__name__ in NORMALISING:
                return None
            if name in _NLL and type(below).__name__ == "LogBackward0":  # log(softmax(x, dim)): over which dim?
                found = _across(node, _first_input(below), "SoftmaxBackward0")
                if found is not None:
                    return found
            if name == _CTC:  # (T, N, C) or (T, C): the classes last, moved to dimension 1 (a view)
                saved = getattr(node, "_saved_log_probs", None)
                if not isinstance(saved, Tensor) or saved.dim() < 2:
                    return None
                direct = getattr(node, "next_functions", ((None, 0),))[0][0]
                return NllInput(saved.movedim(-1, 1), id(below), "ctc_loss", id(direct))
            saved = getattr(node, "_saved_self", None)
            return NllInput(saved, id(below)) if isinstance(saved, Tensor) else None
    return None


def _across(nll: object, below: object, kind: str = "LogSoftmaxBackward0") -> NllInput | None:
    """An ``nll_loss`` given a ``log_softmax``'s output of the same shape (``kind``: or the log of a softmax's): its
    input when that (log-)softmax normalised another dimension than the classes (dimension 1 of a batch, 0 of one
    unbatched vector), else None."""
    if type(below).__name__ != kind:
        return None
    values, result = getattr(nll, "_saved_self", None), getattr(below, "_saved_result", None)
    dim = getattr(below, "_saved_dim", None)
    if not (isinstance(values, Tensor) and isinstance(result, Tensor) and isinstance(dim, int)):
        return None
    if values.shape != result.shape or not values.dim():
        return None  # reshaped in between: which dimension the classes were is not known here
    dim = (dim - _WRAP if dim >= _WRAP // 2 else dim) % values.dim()
    classes = 1 if values.dim() >= 2 else 0
    return None if dim == classes else NllInput(values, id(below), dim=dim)


@dataclass(frozen=True, slots=True)
class ClassLabels:
    """The class indices an ``nll_loss`` saved (to be counted on the device, then dropped), the number of classes
    (dimension 1 of its input, or 0 for one unbatched vector) and its ``ignore_index`` (-100 by default)."""

    target: Tensor
    classes: int
    ignore: int
    values: Tensor | None = None  # the input's values, when one row per sample ((N, classes)): its options counted
    reduced: bool = True  # the loss is the mean or the sum of the rows' terms (not each row's, weighed by hand)


def class_labels(losses: list[Tensor]) -> ClassLabels | None:
    """The labels of the first ``nll_loss`` met from ``losses`` (the roots of one backward call, before it runs),
    unless it weighs its classes (``weight=``: its mean is over weighted terms, and the chance level is not the
    labels' entropy); None for no such loss."""
    for node, _ in _walk(losses):
        if type(node).__name__ in _NLL:
            target, values = getattr(node, "_saved_target", None), getattr(node, "_saved_self", None)
            if getattr(node, "_saved_weight", None) is not None:
                return None
            if not isinstance(target, Tensor) or not isinstance(values, Tensor) or not values.dim():
                return None
            # plain class indices only: a tensor subclass (a DTensor's shard) would make the count a collective
            if type(target) is not Tensor or target.is_sparse or target.is_floating_point() or target.is_complex():
                return None
            ignore = getattr(node, "_saved_ignore_index", -100)
            ignore = ignore - _WRAP if isinstance(ignore, int) and ignore >= _WRAP // 2 else ignore
            classes = int(values.shape[1] if values.dim() >= 2 else values.shape[0])
            rows = values if values.dim() == 2 and type(values) is Tensor else None
            reduced = getattr(node, "_saved_reduction", 1) != 0  # 0: reduction="none"
            return ClassLabels(target, classes, ignore if isinstance(ignore, int) else -100, rows, reduced)
    return None


@dataclass(frozen=True, slots=True)
class ClampedScores:
    """The values a clamp was given before ``binary_cross_entropy`` took its output as probabilities (to be checked
    on the device, then dropped), and the identities of the clamp's graph node and of the node of its input (to name
    the layer whose output they are)."""

    values: Tensor
    node: int
    below: int


def clamped_scores(losses: list[Tensor]) -> ClampedScores | None:
    """The input of the clamp that made the input of the first ``binary_cross_entropy`` met from ``losses`` (the
    roots of one backward call, before it runs); None when no clamp made it. ``binary_cross_entropy`` refuses values
    outside [0, 1], so scores that are no probabilities (a sigmoid forgotten) reach it clamped into that range;
    whether the clamp's input was probabilities already (a sigmoid's output clamped away from 0 and 1 for the log) is
    for the caller to read from the values."""
    for node, _ in _walk(losses):
        if type(node).__name__ == _BCE:
            clamp = _producer(node)
            if clamp is None or type(clamp).__name__ not in _CLAMPS:
                return None
            values = getattr(clamp, "_saved_self", None)
            if not isinstance(values, Tensor):
                return None
            return ClampedScores(values, id(clamp), id(_producer(clamp)))
    return None


@dataclass(frozen=True, slots=True)
class BoundedPrediction:
    """A loss by value (MSE, smooth L1, Huber) on a prediction a bounded activation produced: the target it saved
    (to be profiled on the device, then dropped), the activation, its range, and the identities of its graph node
    and of its input's (to name the layer)."""

    target: Tensor
    activation: str
    low: float
    high: float
    node: int
    below: int


def bounded_prediction(losses: list[Tensor]) -> BoundedPrediction | None:
    """The first loss by value met from ``losses`` (the roots of one backward call, before it runs), when an
    activation of bounded range (:data:`BOUNDED`) produced its prediction; None otherwise. Whether the targets
    lie in that range is for the caller to read from the saved target."""
    for node, _ in _walk(losses):
        if type(node).__name__ in _BY_VALUE:
            found = _producer(node)
            spec = BOUNDED.get(type(found).__name__) if found is not None else None
            target = getattr(node, "_saved_target", None)
            if spec is None or not isinstance(target, Tensor):
                return None
            return BoundedPrediction(target, *spec, id(found), id(_first_input(found)))
    return None


def bounded_node(node: object) -> object | None:
    """The graph node of the bounded activation (:data:`BOUNDED`) whose output a tensor with graph node ``node`` is,
    looking through nodes that only reshape it; None when no such activation made it. A model given another
    model's output (a discriminator given a generator's images) learns what that output can hold."""
    found = _through(node, SHAPE_ONLY)
    return found if found is not None and type(found).__name__ in BOUNDED else None


def bounded_range(node: object) -> tuple[str, float, float] | None:
    """The name and range of the bounded activation whose graph node ``node`` is, None for any other node."""
    return BOUNDED.get(type(node).__name__)


#: Nodes between a log-probability or an advantage and the product that weighs one by the other, looked through:
#: a sign, reshaping, the value of the action taken picked out, a rollout's steps stacked or concatenated (to the
#: first of them).
_STACKING = frozenset({"StackBackward0", "CatBackward0"})
_WEIGHING_PATH = SHAPE_ONLY | _SELECTING | _STACKING | {"NegBackward0", "SumBackward0", "SumBackward1"}
#: Nodes between a softmax's or a sigmoid's probabilities and their log (``Categorical(probs)`` renormalises and
#: clamps them first).
_TO_LOG = frozenset({"ClampBackward1", "ClampMinBackward0", "DivBackward0", "AddBackward0"}) | SHAPE_ONLY
#: A difference: an advantage (a return minus a value, ``R - value``) or a baseline subtracted.
_DIFFERENCES = frozenset({"SubBackward0", "SubBackward1", "RsubBackward0", "RsubBackward1"})
#: Graph nodes walked to collect the parameters a factor depends on, at most.
_PARAMETER_BUDGET = 20000


@dataclass(frozen=True, slots=True)
class UndetachedWeight:
    """A product of a log-probability and a difference (an advantage) in a loss, where the difference depends on
    parameters the log-probability does not (a value head): ``parameters`` are those tensors."""

    parameters: tuple[Tensor, ...]


def undetached_weight(losses: list[Tensor]) -> UndetachedWeight | None:
    """The first product met from ``losses`` (the roots of one backward call, before it runs) of a log-probability
    (a log_softmax, the log of a softmax's or a sigmoid's output, logits minus their logsumexp) and a difference that
    carries a gradient to parameters the log-probability does not use: a policy-gradient loss whose advantage
    ``R - value`` was not detached. None when there is none. Graph nodes only: nothing is read."""
    for node, _ in _walk(losses):
        if type(node).__name__ != "MulBackward0":
            continue
        inputs = [n for n, _ in getattr(node, "next_functions", ())]
        if len(inputs) != 2 or any(n is None for n in inputs):
            continue
        for log_side, weight_side in (inputs, inputs[::-1]):
            if not _is_log_probability(log_side):
                continue
            difference = _through(weight_side, _WEIGHING_PATH)
            if difference is None or type(difference).__name__ not in _DIFFERENCES:
                continue
            policy = _parameters(log_side)
            extra = {k: t for k, t in _parameters(weight_side).items() if k not in policy}
            if extra:
                return UndetachedWeight(tuple(extra.values()))
    return None


def weighs_log_probabilities(losses: list[Tensor]) -> str:
    """Whether the loss of one backward call (``losses``, its roots, before it runs) holds a policy-gradient term:
    a product of the log-probabilities of actions picked from a distribution (a log-softmax's entries picked by
    index, ``Categorical.log_prob``), a Normal's log-density of its samples, or the ratio of two such
    log-probabilities (PPO's surrogate), and an advantage. ``"advantage"``: the weight holds values of both signs
    (returns less a baseline, normalised returns, a detached advantage), or reaches parameters the
    log-probabilities do not use (a value head's advantage left undetached), or weighs a ratio; such a loss is a
    surrogate, which rises as the returns the agent earns grow. ``"weight"``: a constant weight never negative on
    this pass, which may be class weights, a padding mask or a label-smoothing share under a hand-written
    cross-entropy, or an advantage not yet of both signs (returns before a critic learned: every one positive);
    the caller looks again on later passes. ``""``: neither (a focal loss's ``(1 - p)`` made from the same
    log-probabilities, a whole log-softmax times one-hot targets, which picks nothing). Graph nodes, and a constant
    weight's smallest and largest value (two numbers)."""
    found = ""
    for node, _ in _walk(losses):
        if type(node).__name__ != "MulBackward0":
            continue
        inputs = [n for n, _ in getattr(node, "next_functions", ())]
        if len(inputs) != 2:
            continue
        for slot, (log_side, weight_side) in enumerate((inputs, inputs[::-1])):
            if log_side is None or not _picks_log_probability(log_side):
                continue
            if weight_side is None:
                if _is_ratio(log_side) or _both_signs(getattr(node, "_saved_other" if slot == 0 else "_saved_self")):
                    return "advantage"
                found = "weight"
                continue
            policy = _parameters(log_side)
            if any(k not in policy for k in _parameters(weight_side)):
                return "advantage"
    return found


def _is_ratio(node: object) -> bool:
    """Whether ``node`` (through a sign and reshaping) is the exp of a difference: PPO's probability ratio."""
    return _ratio_of(_through(node, _WEIGHING_PATH)) is not None


def _ratio_of(node: object) -> object | None:
    """When ``node`` is the exp of a difference (a ratio of probabilities, ``exp(log_prob - old_log_prob)``), the
    node of the difference's first term; else None."""
    if type(node).__name__ != "ExpBackward0":
        return None
    below = _first_input(node)
    return _first_input(below) if type(below).__name__ == "SubBackward0" else None


def _both_signs(weight: object | None) -> bool:
    """Whether a product's constant operand (as the graph saved it) holds values of both signs: an advantage, not a
    weight."""
    if not isinstance(weight, Tensor) or type(weight) is not Tensor or weight.numel() < 2:
        return False
    if not weight.is_floating_point() or weight.is_sparse:
        return False
    low, high = torch.aminmax(weight.detach())
    return float(low) < 0.0 < float(high)


def _picks_log_probability(node: object) -> bool:
    """Whether ``node`` (through a sign, reshaping, stacking) is log-probabilities of picked entries, a Normal's
    log-density, or the exp of a difference of such log-probabilities (see :func:`weighs_log_probabilities`)."""
    picked = False
    for _ in range(_HOPS):
        name = type(node).__name__
        if node is None or name not in _WEIGHING_PATH:
            break
        picked = picked or name in _SELECTING
        node = _first_input(node)
    if type(node).__name__ == "ExpBackward0":
        term = _ratio_of(node)
        return term is not None and _picks_log_probability(term)
    if _is_gaussian_log_density(node):
        return True
    return picked and _is_log_probability(node)


def _through(node: object, path: frozenset[str]) -> object | None:
    """The first node from ``node`` down its first inputs that is not one of ``path``."""
    for _ in range(_HOPS):
        if node is None or type(node).__name__ not in path:
            return node
        node = _first_input(node)
    return node


def _is_log_probability(node: object) -> bool:
    """Whether ``node`` (looking through a sign, reshaping and picking) computes log-probabilities: a log_softmax,
    the log of a softmax's or a sigmoid's output (through a clamp or a renormalisation), logits minus their
    logsumexp, a Normal's log-density; or a ratio of probabilities, the exp of a log-probability minus another."""
    found = _through(node, _WEIGHING_PATH)
    name = type(found).__name__
    if name == "ExpBackward0":  # a probability ratio, exp(log_prob - old_log_prob): PPO's surrogate weighs it
        term = _ratio_of(found)
        return term is not None and _is_log_probability(term)
    if name == "LogSoftmaxBackward0":
        return True
    if name == "LogBackward0":
        below = _through(_first_input(found), _TO_LOG)
        return type(below).__name__ in ("SoftmaxBackward0", "SigmoidBackward0")
    if name == "SubBackward0":
        inputs = [n for n, _ in getattr(found, "next_functions", ())]
        if len(inputs) == 2 and type(_through(inputs[1], SHAPE_ONLY)).__name__ == "LogsumexpBackward0":
            return True
    return _is_gaussian_log_density(found)


def _is_gaussian_log_density(node: object) -> bool:
    """Whether ``node`` is a Normal distribution's ``log_prob`` as torch writes it: ``-(x - loc) ** 2 / (2 * var)
    - log(scale) - log(sqrt(2 * pi))``."""
    if type(node).__name__ in ("SubBackward0", "SubBackward1"):
        inner = _first_input(node)
        if type(inner).__name__ == "SubBackward0":
            node = inner
    inputs = [n for n, _ in getattr(node, "next_functions", ())]
    if type(node).__name__ != "SubBackward0" or len(inputs) != 2:
        return False
    quotient, log_scale = inputs
    if type(quotient).__name__ != "DivBackward0" or type(log_scale).__name__ != "LogBackward0":
        return False
    negated = _first_input(quotient)
    return type(negated).__name__ == "NegBackward0" and type(_first_input(negated)).__name__ == "PowBackward0"


def _parameters(node: object) -> dict[int, Tensor]:
    """The leaf tensors (parameters) that the graph below ``node`` accumulates gradients into, by identity."""
    found: dict[int, Tensor] = {}
    stack, seen = [node], {id(node): node}  # by id, each node held while the walk runs (see hold)
    while stack and len(seen) < _PARAMETER_BUDGET:
        current = stack.pop()
        variable = getattr(current, "variable", None)
        if isinstance(variable, Tensor):
            found[id(variable)] = variable
        for nxt, _ in getattr(current, "next_functions", ()):
            if nxt is not None and id(nxt) not in seen:
                seen[id(nxt)] = nxt
                stack.append(nxt)
    return found


def _regression(node: object) -> Regression | None:
    """The MSE node's target when its reduction is the mean and its prediction holds one value per sample (a
    column ``(N, 1)`` or a vector ``(N,)``, the shape of a regression on one number per sample), or holds several,
    ``(N, C)``, against one target value per sample that was broadcast across them (its stride along the columns
    is 0: torch's ``mse_loss`` expands a ``(N, 1)`` target, with a warning; a target copied C times is not seen);
    else None."""
    if getattr(node, "_saved_reduction", None) != _MEAN:
        return None
    prediction, target = getattr(node, "_saved_self", None), getattr(node, "_saved_target", None)
    if not isinstance(prediction, Tensor) or not isinstance(target, Tensor):
        return None
    shape = prediction.shape
    if (
        prediction.dim() == 2
        and shape[0] >= 2
        and shape[1] >= 2
        and target.shape == shape
        and target.layout is torch.strided
        and target.stride(1) == 0
        and target.stride(0) != 0
    ):
        return Regression(target[:, :1], int(shape[0]), int(shape[1]), id(_first_input(node)))
    one_each = prediction.dim() == 1 or (prediction.dim() == 2 and shape[1] == 1)
    if not one_each or target.numel() != prediction.numel() or prediction.numel() < 2:
        return None
    return Regression(target, int(prediction.numel()))


#: Loss nodes whose chance level their targets give: a binary cross-entropy's (on logits or on probabilities), and
#: a mean squared error's.
_TARGETED = {
    "BinaryCrossEntropyWithLogitsBackward0": "bce",
    "BinaryCrossEntropyBackward0": "bce",
    _MSE: "mse",
    # a Huber loss's targets are read for their scale only (their chance level is not a variance)
    "SmoothL1LossBackward0": "huber",
    "HuberLossBackward0": "huber",
}


@dataclass(frozen=True, slots=True)
class LossTargets:
    """The targets of a binary cross-entropy (``kind`` ``"bce"``), a mean squared error (``"mse"``) or a Huber loss
    (``"huber"``: ``smooth_l1_loss``, ``huber_loss``, read for the targets' scale) that is the
    whole loss, averaged (to be profiled on the device, then dropped): samples on dimension 0."""

    kind: str
    target: Tensor


@dataclass(frozen=True, slots=True)
class SoftmaxTargets:
    """A binary cross-entropy on probabilities (``nn.BCELoss``) whose input is a softmax's output: the softmax's
    node and the node whose output it took (to name the layer), the loss's targets and the dimension the softmax
    normalised (to be read on the device, then dropped)."""

    node: int
    below: int
    target: Tensor
    dim: int


def softmax_under_bce(losses: list[Tensor]) -> SoftmaxTargets | None:
    """The first ``binary_cross_entropy`` below the roots of one backward call (``losses``, before it runs: the pass
    frees what the graph saved) when its input is a softmax's output of the targets' shape (looking through
    reshapes), else None. A softmax makes the values along its dimension sum to 1; ``nn.BCELoss`` asks each of them
    for its own label: targets that hold more than one positive label along that dimension (multi-label tags)
    cannot be reached (see :mod:`neuraldbg.kinds.activation_before_loss`). Graph attributes only: nothing read."""
    for node, _ in _walk(losses):
        if type(node).__name__ != _BCE:
            continue
        found = _producer(node)
        if type(found).__name__ != "SoftmaxBackward0":
            return None
        target, result = getattr(node, "_saved_target", None), getattr(found, "_saved_result", None)
        dim = getattr(found, "_saved_dim", None)
        if not (isinstance(target, Tensor) and isinstance(result, Tensor) and isinstance(dim, int)):
            return None
        if type(target) is not Tensor or not target.is_floating_point() or target.shape != result.shape:
            return None  # a subclass (a shard: its reading would be a collective), or reshaped in between
        if not target.dim():
            return None
        dim = (dim - _WRAP if dim >= _WRAP // 2 else dim) % target.dim()
        return SoftmaxTargets(id(found), id(_first_input(found)), target, dim)
    return None


_UNIT_SCALES = frozenset({"DivBackward0", "MulBackward0"})


def _unit_scaled(node: object) -> object:
    """The node below a division or a product by the constant 1 at the top of a loss (a script's ``loss /
    accumulation_steps`` with one step), else ``node``. The constant is a number torch wrapped in a CPU tensor:
    reading it costs no device transfer; any other scale, or a tensor on a device, is left as it is."""
    while type(node).__name__ in _UNIT_SCALES:
        other = getattr(node, "_saved_other", None)
        inputs: tuple[tuple[object, int], ...] = getattr(node, "next_functions", ())
        if not (isinstance(other, Tensor) and other.dim() == 0 and other.device.type == "cpu"):
            return node
        if len(inputs) != 2 or inputs[1][0] is not None or inputs[0][0] is None or float(other) != 1.0:
            return node
        node = inputs[0][0]
    return node


def loss_targets(losses: list[Tensor]) -> LossTargets | None:
    """The targets of the loss of one backward call (``losses``, its roots, before it runs: the pass frees what the
    graph saved) when that loss is a binary cross-entropy or a mean squared error itself: one root, its node that
    loss's with the mean reduction, no ``weight`` nor ``pos_weight`` (a weighted mean's chance level is not the
    targets' entropy), a prediction of the target's shape (a broadcast compares other pairs), plain floating
    targets. Nothing added to it, nothing masked out of it: a loss masked by hand (``reduction="none"``, a product
    with a mask, a sum over a count) or divided by the micro-batches of an accumulation is not read; divided or
    multiplied by exactly 1 it is the loss itself (``loss / gradient_accumulation_steps`` at its default of 1). None
    otherwise."""
    node = _unit_scaled(losses[0].grad_fn) if len(losses) == 1 else None
    kind = _TARGETED.get(type(node).__name__)
    if kind is None or getattr(node, "_saved_reduction", None) != _MEAN:
        return None
    if any(getattr(node, a, None) is not None for a in ("_saved_weight", "_saved_pos_weight")):
        return None
    prediction, target = getattr(node, "_saved_self", None), getattr(node, "_saved_target", None)
    if not isinstance(prediction, Tensor) or not isinstance(target, Tensor):
        return None
    # plain values only: a tensor subclass (a DTensor's shard) would make the reading a collective
    if type(target) is not Tensor or target.is_sparse or not target.is_floating_point():
        return None
    if prediction.shape != target.shape or target.dim() == 0 or target.shape[0] < 2:
        return None
    return LossTargets(kind, target)


def sample_targets(losses: list[Tensor]) -> tuple[int, ...] | None:
    """The shape of the targets of the first loss node met from ``losses`` (the roots of one backward call, before
    it runs) when they are one per sample: ``(N,)`` class indices of an ``nll_loss`` given ``(N, classes)``, or the
    ``(N,)`` or ``(N, k)`` targets of a loss by value or a binary cross-entropy of the prediction's shape. None
    otherwise: targets per token (an ``nll_loss`` over ``(N, classes, T)``, a 3-d target), or no such loss. A
    classifier's labels flattened over the tokens, ``(N * T,)``, read as ``N * T`` samples. Shapes only."""
    for node, _ in _walk(losses):
        name = type(node).__name__
        if name not in _NLL and name not in _TARGETED:
            continue
        target, given = getattr(node, "_saved_target", None), getattr(node, "_saved_self", None)
        if not isinstance(target, Tensor) or not isinstance(given, Tensor):
            return None
        if name in _NLL:
            one_each = target.dim() == 1 and given.dim() == 2 and given.shape[0] == target.shape[0]
        else:
            one_each = target.dim() in (1, 2) and given.shape == target.shape
        return tuple(int(n) for n in target.shape) if one_each else None
    return None


def next_token_nll(losses: list[Tensor], tokens: Tensor) -> tuple[object, Tensor] | None:
    """How much an ``nll_loss`` met from ``losses`` (the roots of one backward call, before it runs) is a next-token
    objective over ``tokens``, the model's ``(batch, length)`` or ``(length, batch)`` token input: that node, and of
    the scored positions whose next input token differs from their own, the fraction whose target is that next
    token, as a 0-d float tensor (read later); the larger of the two layouts that fit. Its targets, one per
    position, number the input's positions (the last one's target lies past the input) or one fewer (the model's
    output for the last position dropped). The first ``nll_loss`` whose targets fit is read (an auxiliary head's
    loss of one label per sequence beside it is passed over); None when none does. The layout is read, nothing
    else."""
    if tokens.dim() != 2 or min(tokens.shape) < 1 or max(tokens.shape) < 3:
        return None
    for node, _ in _walk(losses):
        if type(node).__name__ not in _NLL:
            continue
        target = getattr(node, "_saved_target", None)
        if not isinstance(target, Tensor) or target.is_floating_point() or target.device != tokens.device:
            continue
        ignore = getattr(node, "_saved_ignore_index", -100)
        found = [s for t in (tokens, tokens.t()) if (s := _ahead(target, t, ignore)) is not None]
        if found:
            return node, torch.stack(found).max()
    return None


@torch.no_grad()
def scored_positions(node: object, tokens: Tensor) -> Tensor | None:
    """The positions of ``tokens`` whose next-token target the ``nll_loss`` ``node`` (of :func:`next_token_nll`)
    scores for some sample (not its ``ignore_index``), as a boolean vector of the tokens' length, in the layout
    (batch first, or sequence first) whose targets are the most often the next token; None when its targets fit
    neither."""
    target = getattr(node, "_saved_target", None)
    if not isinstance(target, Tensor) or tokens.dim() != 2:
        return None
    ignore = getattr(node, "_saved_ignore_index", -100)
    best: tuple[float, Tensor] | None = None
    for t in (tokens, tokens.t()):
        batch, length = t.shape
        share = _ahead(target, t, ignore)
        if share is None:
            continue
        if target.numel() == batch * length:
            scored = (target.reshape(batch, length) != ignore).any(0)
        else:  # one target fewer than positions: the last position has no next token
            unscored = torch.zeros(1, dtype=torch.bool, device=target.device)
            scored = torch.cat([(target.reshape(batch, length - 1) != ignore).any(0), unscored])
        if best is None or float(share) > best[0]:
            best = (float(share), scored)
    return best[1] if best is not None else None


@torch.no_grad()
def _ahead(target: Tensor, tokens: Tensor, ignore: int) -> Tensor | None:
    """:func:`next_token_nll`'s share for ``tokens`` laid out ``(batch, length)`` (None: the targets do not fit)."""
    batch, length = tokens.shape
    if target.numel() == batch * length:
        scored = target.reshape(batch, length)[:, :-1]
    elif target.numel() == batch * (length - 1) and length > 2:
        scored = target.reshape(batch, length - 1)
    else:
        return None
    return stats.ahead_share(tokens, scored, ignore)


@dataclass(frozen=True, slots=True)
class Crossed:
    """A loss that compared a prediction with targets of other samples: what compared them (``mse_loss``, or a
    difference taken by hand), the prediction's shape, the shape both were broadcast to, and the identity of the
    graph node that produced the prediction (to name the layer)."""

    loss: str
    prediction: tuple[int, ...]
    compared: tuple[int, ...]
    node: int


def _count(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _pairs_samples(prediction: tuple[int, ...], compared: tuple[int, ...]) -> bool:
    """Whether broadcasting ``prediction`` to ``compared`` repeats it along a dimension as long as its batch (its
    first dimension, at least 2) that is not that batch's own: ``(N, 1)`` or ``(N, 1, T)`` taken to ``(N, N, ...)``,
    or ``(N,)`` to ``(N, N)``. A prediction of ``(1, D)`` against ``(N, D)`` (one value for all samples) is not."""
    if not prediction or len(compared) < len(prediction) or prediction[0] < 2:
        return False
    padded = (1,) * (len(compared) - len(prediction)) + prediction
    batch_at = len(compared) - len(prediction)
    return any(p == 1 and c == prediction[0] and d != batch_at for d, (p, c) in enumerate(zip(padded, compared)))


def crossed(losses: list[Tensor], outputs: dict[int, str]) -> Crossed | None:
    """The first loss met from ``losses`` (the roots of one backward call, before it runs) that broadcast its
    prediction against targets of other samples; None when there is none. Two ways are read:

    * a loss by value of torch's (``mse_loss``, ``smooth_l1_loss``, ``huber_loss``: torch warns "Using a target size
      that is different to the input size" and goes on) whose prediction was expanded, to more elements than the
      prediction and the target each hold (the target's own values: its dimensions of stride 0 are a broadcast);
    * a difference taken by hand (``pred - y``, ``y - pred``, as in ``((pred - y) ** 2).mean()`` or ``l1_loss``)
      between a watched layer's output (``outputs``: the graph nodes of the layers' outputs) and a tensor without
      a gradient, whose result repeats that output along a dimension as long as its batch (:func:`_pairs_samples`).
    """
    for node, _ in _walk(losses):
        name = type(node).__name__
        if name in _BY_VALUE:
            first = _first_input(node)
            values, target = getattr(node, "_saved_self", None), getattr(node, "_saved_target", None)
            sizes = getattr(first, "_saved_self_sym_sizes", None)
            if type(first).__name__ != "ExpandBackward0" or sizes is None:
                return None
            if not isinstance(values, Tensor) or not isinstance(target, Tensor):
                return None
            prediction = tuple(int(n) for n in sizes)
            compared = tuple(int(n) for n in values.shape)
            own = _count(tuple(int(n) for n, st in zip(target.shape, target.stride()) if st != 0))
            if _count(compared) > max(_count(prediction), own):
                return Crossed(_BY_VALUE_NAMES[name], prediction, compared, id(_first_input(first)))
            return None
        if name == "SubBackward0":
            found = _crossed_difference(node, outputs)
            if found is not None:
                return found
    return None


def _crossed_difference(node: object, outputs: dict[int, str]) -> Crossed | None:
    """A difference between a watched layer's output and a tensor without a gradient that repeats the output
    along a dimension as long as its batch (see :func:`crossed`)."""
    sides: tuple[tuple[object, int], ...] = getattr(node, "next_functions", ())
    if len(sides) != 2 or (sides[0][0] is None) == (sides[1][0] is None):
        return None
    producer, slot = sides[0] if sides[0][0] is not None else sides[1]
    if id(producer) not in outputs:
        return None
    shapes = getattr(producer, "_input_metadata", ())
    result = getattr(node, "_input_metadata", ())
    if slot >= len(shapes) or not result:
        return None
    prediction = tuple(int(n) for n in shapes[slot].shape)
    compared = tuple(int(n) for n in result[0].shape)
    if _count(compared) > _count(prediction) and _pairs_samples(prediction, compared):
        return Crossed("a difference taken by hand", prediction, compared, id(producer))
    return None


def _first_input(node: object) -> object:
    """The node of ``node``'s first input (None when it has none, or a leaf's)."""
    inputs = getattr(node, "next_functions", ())
    return inputs[0][0] if inputs else None


def _producer(node: object) -> object:
    """The node that produced the input of ``node``, looking through nodes that only reshape it or pick some of its
    values."""
    found = _first_input(node)
    for _ in range(_HOPS):
        if found is None or (type(found).__name__ not in SHAPE_ONLY and type(found).__name__ not in _SELECTING):
            break
        found = _first_input(found)
    return found
