"""Cheap tensor statistics, computed on the tensors' own device without recording anything for autograd.

Nothing here moves data to the host: every function returns small tensors, and :func:`to_host` moves a whole
batch of them in one transfer (one ``.tolist()`` per device), never one ``.item()`` per layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from operator import attrgetter, is_, itemgetter, methodcaller

import torch
from torch import Tensor

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_FLOAT32 = frozenset({torch.float32})
_dtype = attrgetter("dtype")
_shape = attrgetter("shape")
_contiguous = methodcaller("is_contiguous")
# grad mode switched by a direct call: ``torch.no_grad()`` costs a few Python calls, paid on every hook call
_set_grad_enabled = torch._C._set_grad_enabled
#: every tensor's values, flattened and copied one after another into one new 1-d tensor, in one C++ call
_flatten: Callable[[Sequence[Tensor]], Tensor] = getattr(
    torch._C._nn, "flatten_dense_tensors", lambda ts: torch.cat([t.reshape(-1) for t in ts])
)


def all_float32(tensors: Sequence[Tensor]) -> bool:
    """Whether every tensor is float32 (the common case, reduced without any cast)."""
    return set(map(_dtype, tensors)) <= _FLOAT32


def first_tensor(value: object) -> Tensor | None:
    """The first floating-point tensor in a module output (tensor, tuple, list, dict, PackedSequence)."""
    if isinstance(value, Tensor):
        return value if value.is_floating_point() else None
    if type(value) is not tuple:  # a plain tuple (a call's arguments) has no ``data``: no lookup that fails
        data = getattr(value, "data", None)  # PackedSequence (a tuple subclass)
        if isinstance(data, Tensor):
            return data if data.is_floating_point() else None
        if isinstance(value, dict):
            value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def data_argument(args: tuple[object, ...], kwargs: dict[str, object] | None = None) -> Tensor | None:
    """The input batch of a model call: its first tensor argument (positional first, then keyword), when it is
    floating point; None when that first tensor is not (token ids, indices: their values are never non-finite).

    Later arguments are not data: an additive attention mask (``nn.Transformer.generate_square_subsequent_mask``,
    ``-inf`` above the diagonal) is passed after the tokens it masks, and its ``-inf`` is how masking works."""
    if args and isinstance(args[0], Tensor):  # the common call, without building the list of every argument
        return args[0] if args[0].is_floating_point() else None
    for value in (*args, *(kwargs or {}).values()):
        found = _first_any(value)
        if found is not None:
            return found if found.is_floating_point() else None
    return None


def batch_size(args: tuple[object, ...], kwargs: dict[str, object] | None = None) -> int | None:
    """The first dimension of a call's first tensor argument (its batch), None when it has none."""
    first = tensor_arguments(args, kwargs, most=1)
    return first[0].shape[0] if first and first[0].dim() else None


def batched(t: Tensor, batch: int | None) -> bool:
    """Whether ``t`` has the call's batch as its first dimension: a data argument, not a count (the Trainer's
    ``num_items_in_batch``), a scale or a square attention mask of another size."""
    return batch is not None and t.dim() > 0 and t.shape[0] == batch


def data_scale(tensors: list[Tensor]) -> Tensor:
    """On the device, the largest root-mean-square among ``tensors`` that are finite everywhere and hold a positive
    value: the scale of a call's data arguments, not of an additive attention mask (0 and -inf, or 0 and -1e9: no
    positive value) nor of a non-finite value (the non-finite checks' story). 0 when none qualifies."""
    scales = []
    for t in tensors:
        if t.numel() == 0:
            continue
        scale = rms(t)
        data = torch.isfinite(scale) & (t.detach().amax() > 0)
        scales.append(torch.where(data, scale, torch.zeros_like(scale)))
    return torch.stack(scales).amax() if scales else torch.zeros(())


def rms(t: Tensor) -> Tensor:
    """On the device, the root-mean-square of ``t`` as a 0-d float32 tensor (NaN when it holds a non-finite value)."""
    v = t.detach().float()
    norm: Tensor = torch.linalg.vector_norm(v)
    return norm / math.sqrt(max(v.numel(), 1))


def tensor_arguments(args: tuple[object, ...], kwargs: dict[str, object] | None = None, most: int = 32) -> list[Tensor]:
    """The plain tensors among a call's arguments, looked for inside tuples, lists and dicts (a batch dict), at
    most ``most`` of them."""
    if not kwargs and len(args) <= most:  # a layer's call (x, or x and h): its arguments, when all are plain tensors
        for a in args:
            if type(a) not in _PLAIN_TYPES:
                break
        else:
            return list(args)  # type: ignore[arg-type]  # every one a plain tensor, as just checked
    found: list[Tensor] = []
    stack: list[object] = [*reversed((*args, *(kwargs or {}).values()))]
    while stack and len(found) < most:
        value = stack.pop()
        if isinstance(value, Tensor):
            if type(value) in _PLAIN:
                found.append(value)
        elif isinstance(value, dict):
            stack.extend(reversed(list(value.values())))
        elif isinstance(value, (tuple, list)):
            stack.extend(reversed(value))
    return found


def token_argument(args: tuple[object, ...], kwargs: dict[str, object] | None = None) -> Tensor | None:
    """The token ids of a model call: its first tensor argument, when it holds integers (None otherwise)."""
    for value in (*args, *(kwargs or {}).values()):
        found = _first_any(value)
        if found is not None:
            return None if found.is_floating_point() or found.dtype is torch.bool else found
    return None


@torch.no_grad()
def holds(tokens: Tensor, token: int) -> Tensor:
    """1.0 when ``tokens`` holds ``token`` somewhere, else 0.0: a 0-d tensor on ``tokens``' device."""
    return (tokens == token).any().float()


def _first_any(value: object) -> Tensor | None:
    """The first tensor of any dtype in a value (tensor, PackedSequence, tuple, list, dict)."""
    if isinstance(value, Tensor):
        return value
    data = getattr(value, "data", None)  # PackedSequence
    if isinstance(data, Tensor):
        return data
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_any(item)
            if found is not None:
                return found
    return None


def other_floats(args: tuple[object, ...], kwargs: dict[str, object] | None, data: Tensor | None) -> list[Tensor]:
    """The floating-point tensors among a model call's arguments other than its data argument (labels handed to a
    model that computes its own loss, masks, extra features), at most eight, plain strided ones only."""
    found: list[Tensor] = []

    def walk(value: object) -> None:
        if len(found) >= 8:
            return
        if isinstance(value, Tensor):
            if (
                value is not data
                and value.is_floating_point()
                and type(value) in _PLAIN
                and value.layout is torch.strided
            ):
                found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (tuple, list)):
            for item in value:
                walk(item)

    walk(args)
    walk(kwargs or {})
    return found


def nan_flag(tensors: Sequence[Tensor]) -> Tensor:
    """NaN (on the device) when any of ``tensors`` holds a NaN, else 0: a NaN is never how a mask works (an additive
    mask's ``-inf`` is), so a NaN among a model call's arguments is bad data however the call names it."""
    with torch.no_grad():
        flags = torch.stack([has_nan(t.detach()) for t in tensors])
        return torch.where(
            flags.any(), torch.tensor(math.nan, device=flags.device), torch.tensor(0.0, device=flags.device)
        )


#: A tensor's ``.grad``, and whether a value is None: for ``map`` over many parameters in one C call a step.
grad_of = attrgetter("grad")
is_none = partial(is_, None)


def readable(t: Tensor) -> Tensor | None:
    """``t`` itself when it is a plain strided tensor, else :func:`dense` of it (sparse tensors: their values;
    None for a meta tensor or a subclass that cannot be read)."""
    return dense(t)


def class_count(value: object) -> int:
    """The size of the last dimension of a model's logits (a classifier's classes, a language model's vocabulary):
    the ``logits`` of a Hugging Face output, else the first floating tensor of two or more dimensions in the output;
    0 when there is none. Shape only: nothing is read."""
    logits = getattr(value, "logits", None)
    if isinstance(logits, Tensor) and logits.is_floating_point() and logits.dim() >= 2:
        return int(logits.shape[-1])
    if isinstance(value, Tensor):
        return int(value.shape[-1]) if value.is_floating_point() and value.dim() >= 2 else 0
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            found = class_count(item)
            if found:
                return found
    return 0


@torch.no_grad()
def in_unit_interval(t: Tensor) -> Tensor:
    """1.0 when every element of ``t`` lies in [0, 1] (probabilities), else 0.0: a 0-d tensor, on ``t``'s device."""
    t = t.detach()
    return ((t.amin() >= 0) & (t.amax() <= 1)).float()


def target_profile(t: Tensor) -> Tensor:
    """A regression target's profile as one 1-d float tensor on ``t``'s device: [1.0 when every value is an integer
    (else 0.0), its smallest value, its largest value, its variance over all elements]. Nothing is read to the
    host here."""
    t = t.detach().reshape(-1).float()
    integer = (t == t.round()).all().float()
    return torch.stack((integer, t.amin(), t.amax(), t.var(correction=0)))


def out_of_range(target: Tensor, low: float, high: float) -> Tensor:
    """How much of a regression target an output bounded to [low, high] cannot reach, as one 1-d float tensor on
    the target's device (read later): [the share of its elements outside the range, the mean squared distance of
    the elements to the range (the least mean squared error such an output can reach), the target's variance]."""
    t = target.detach().reshape(-1).float()
    if not t.numel():
        return t.new_zeros(3)
    gap = t - t.clamp(low, high)
    return torch.stack(((gap != 0).float().mean(), gap.pow(2).mean(), t.var(correction=0)))


def label_counts(target: Tensor, classes: int, ignore: int) -> Tensor:
    """How often each class is a label in ``target`` (class indices), as a 1-d float tensor of ``classes + 1``
    counts on its device (read later): entries equal to ``ignore`` are not counted, any other index outside
    [0, classes) in the last bin. A fixed number of bins and ``scatter_add``: nothing waits for the device (a
    ``bincount`` or a boolean index would)."""
    t = target.detach().reshape(-1).long()
    bins = t.clamp(-1, classes) % (classes + 1)  # below 0 (-1) and from ``classes`` on: bin ``classes``
    counted = (t != ignore).float()
    return torch.zeros(classes + 1, device=t.device).scatter_add_(0, bins, counted)


#: Labels a training step must hold for its mix of classes to count (fewer give a skewed mix by chance alone).
MIXED_MIN_LABELS = 8


def binary_counts(target: Tensor) -> Tensor:
    """The counts of :func:`label_counts` for a binary cross-entropy's targets (one per row, in [0, 1]: a soft
    label counts towards both classes), as a 1-d float tensor [negatives, positives, 0] on its device."""
    t = target.detach().reshape(-1).float().clamp(0, 1)
    positives = t.sum()
    return torch.stack((t.numel() - positives, positives, torch.zeros_like(positives)))


def step_label_mix(counts: Tensor) -> Tensor:
    """How mixed one training step's labels are, from their :func:`label_counts` (all its backward passes added
    up), as one 1-d float tensor on their device (read later): [its most frequent class, that class's share of its
    labels, 1 when the step held at least :data:`MIXED_MIN_LABELS` labels, else 0]."""
    seen = counts[:-1]
    n = seen.sum()
    share, top = (seen / n.clamp(min=1)).max(0)
    counted = (n >= MIXED_MIN_LABELS).to(share.dtype)
    return torch.stack((top.to(share.dtype), share, counted)).float()


def finite_per_row(values: Tensor) -> Tensor:
    """How many entries of each row of ``values`` (an ``nll_loss`` input, one row of classes per sample) are finite,
    averaged over the rows, as a 0-d float tensor on its device (read later): the classes the loss chooses among (a
    contrastive loss masks each sample's own column with -inf)."""
    return torch.isfinite(values.detach()).sum(1, dtype=torch.float32).mean()


def label_entropy(counts: Tensor) -> Tensor:
    """What the label counts of :func:`label_counts` say, as one 1-d float tensor on their device (read later): [the
    entropy of the labels' frequencies in nats, with the Miller-Madow correction (+ (classes seen - 1) / 2n) for
    the bias of a plug-in estimate from n labels; n; the labels outside the classes; the most frequent class's
    share of the labels]."""
    seen = counts[:-1]
    n = seen.sum()
    p = seen / n.clamp(min=1)
    entropy = -torch.special.xlogy(p, p).sum() + ((seen > 0).sum() - 1).clamp(min=0) / (2 * n.clamp(min=1))
    return torch.stack((entropy, n, counts[-1], p.max()))


def log_prob_gap(t: Tensor) -> Tensor:
    """How far ``t`` (an ``nll_loss`` input: classes on dimension 1, or 0 for one unbatched vector) is from
    log-probabilities: the largest ``|logsumexp|`` over the classes of its rows, 0 for log-probabilities, as a
    0-d float tensor on ``t``'s device (read later). Rows whose log-sum-exp is not finite (every class masked to
    -inf, a NaN the non-finite checks report) are left out, and so is an input of no rows (a loss over an empty
    selection: 0)."""
    values = t.detach().float()
    lse = torch.logsumexp(values, dim=1 if values.dim() >= 2 else 0)
    gap = torch.where(torch.isfinite(lse), lse.abs(), torch.zeros_like(lse))
    return gap.amax() if gap.numel() else gap.new_zeros(())


def outside_unit(t: Tensor) -> Tensor:
    """The share of the finite values of ``t`` outside [0, 1] (0 for probabilities, and for no finite value), as a
    0-d float tensor on ``t``'s device (read later)."""
    values = t.detach()
    finite = torch.isfinite(values)
    outside = finite & ((values < 0) | (values > 1))
    return outside.sum().float() / finite.sum().clamp(min=1).float()


def positive_labels(target: Tensor, dim: int) -> Tensor:
    """How many positive labels ``target`` holds along ``dim`` per row (its values summed there: a soft label counts
    its weight), averaged over the rows, as a 0-d float tensor on its device (read later)."""
    return target.detach().float().sum(dim).mean()


def labels_ahead(input_ids: Tensor, labels: Tensor, ignore: int = -100) -> Tensor:
    """Of the scored label positions t (all but the last; ``ignore`` is not scored) whose next input token differs
    from their own, the fraction whose label is the next token ``input_ids[:, t + 1]`` rather than the token at t,
    as a 0-d float tensor on the labels' device (read later); 0 when there is no such position.

    Only there can a label tell a shift: where the data repeats its token (a pixel stream's background), labels
    equal to the token at t are equal to the next one too, and unshifted labels would look shifted."""
    return ahead_share(input_ids, labels[:, :-1], ignore)


@torch.no_grad()
def hides_later(hidden: Tensor, rows: Tensor | None = None) -> bool:
    """Whether a boolean attention mask (True: hidden) hides every later key from every query: laid out queries by
    keys over its last two axes (queries may be one row, broadcast), every entry above the diagonal True. ``rows``
    (a boolean vector, one entry per query): only those queries count (the positions a loss scores: a prefix LM's
    unscored prefix sees its whole prefix by design). A mask not laid out so is taken to hide them (not judged).
    Reads the mask: one value to the host."""
    length = hidden.shape[-1] if hidden.dim() >= 2 else 0
    if not length or hidden.shape[-2] not in (1, length):
        return True
    return bool(hidden_grid(hidden).expand(length, length)[later_keys(length, rows, hidden.device)].all())


def hidden_grid(hidden: Tensor) -> Tensor:
    """A boolean attention mask's last two axes, hidden where every batch element and head hides (a mask of one
    grid, per sample or per head, kept as one grid)."""
    return hidden.reshape(-1, *hidden.shape[-2:]).all(0) if hidden.dim() > 2 else hidden


def later_keys(length: int, rows: Tensor | None, device: torch.device) -> Tensor:
    """The entries above the diagonal of a ``length`` x ``length`` grid of queries by keys (a later key for its
    query), as a boolean mask; with ``rows`` (one boolean per query, of that length), in those rows only."""
    later = torch.ones(length, length, dtype=torch.bool, device=device).triu(1)
    if rows is not None and rows.shape == (length,):
        later &= rows.to(device).view(length, 1)
    return later


def ahead_share(tokens: Tensor, scored: Tensor, ignore: int = -100) -> Tensor:
    """:func:`labels_ahead` for the labels of positions 0 to length - 2 alone, ``scored`` (``(batch, length - 1)``,
    beside ``(batch, length)`` tokens): of those not ``ignore`` whose next token differs from their own, the
    fraction that is the next token, as a 0-d float tensor on the labels' device; 0 when there is none."""
    now, nxt = tokens[:, :-1], tokens[:, 1:]
    telling = (scored != ignore) & (now != nxt)
    hits = ((scored == nxt) & telling).sum().float()
    return hits / telling.sum().clamp(min=1).float()


def scored_padding(labels: Tensor, mask: Tensor, ignore: int = -100) -> Tensor:
    """Of the labels a causal LM scores (all but the first position, which its shift drops; ``ignore`` is not
    scored), the fraction at positions its ``attention_mask`` hides (0: padding), as a 0-d float tensor on the
    labels' device (read later); 0 when none is scored."""
    label, hidden = labels[:, 1:], mask[:, 1:] == 0
    scored = label != ignore
    return (scored & hidden).sum().float() / scored.sum().clamp(min=1).float()


@torch.no_grad()
def mask_inverted(tokens: Tensor, hidden: Tensor) -> Tensor:
    """Whether a padding mask hides the text, as a 0-d float tensor on the tokens' device (read later): 1.0 when it
    hides the real tokens and shows the padding (the positions ``hidden`` marks hold more than one token id while all
    those it leaves visible hold one and the same id, the padding's), 2.0 when it hides every position of a batch
    whose tokens differ (a mask of zeros), else 0.0. A mask the right way round hides the padding, one id, and shows
    the text, many; a mask that hides some real tokens on purpose still shows others, which differ."""
    ids = tokens.long()
    top, bottom = torch.iinfo(torch.long).max, torch.iinfo(torch.long).min
    shown = ~hidden
    one_shown = torch.where(shown, ids, top).amin() == torch.where(shown, ids, bottom).amax()
    many_hidden = torch.where(hidden, ids, top).amin() < torch.where(hidden, ids, bottom).amax()
    everything = hidden.all()
    return torch.where(everything, 2 * many_hidden.float(), (one_shown & many_hidden).float())


#: A float mask (padding or causal) hides a position with a value at or below this (-inf, or a large negative number
#: such as torch.finfo(dtype).min or -1e9, added to the attention scores).
HIDDEN_SCORE = -1e4


def hidden_positions(mask: Tensor, attend_is_one: bool) -> Tensor:
    """The positions a padding mask hides, as a bool tensor: a Hugging Face ``attention_mask``
    (``attend_is_one``: 1 attends, 0 hides) or torch's ``key_padding_mask`` (True, or a large negative score, hides)."""
    if attend_is_one:
        return mask == 0
    if mask.dtype is torch.bool:
        return mask
    return mask <= HIDDEN_SCORE


#: Tensor types whose values the reductions read directly.
_PLAIN = (Tensor, torch.nn.Parameter)
_PLAIN_TYPES = frozenset(_PLAIN)
_kind = attrgetter("layout", "dtype", "is_cpu")


def all_dense_on_cpu(tensors: Sequence[Tensor]) -> bool:
    """Whether :func:`dense` returns every tensor as it is (plain, strided, real floating values: not quantized,
    not meta) and every one is on the CPU; checked over the whole list at once (a set of types and one of layout,
    dtype and device), not tensor by tensor."""
    return dense_cpu_dtypes(tensors) is not None


def plain_types(tensors: Sequence[Tensor]) -> bool:
    """Whether every one of ``tensors`` is a plain ``Tensor`` or ``Parameter`` (no subclass), in one pass."""
    return set(map(type, tensors)) <= _PLAIN_TYPES


def dense_cpu_dtypes(tensors: Sequence[Tensor]) -> set[torch.dtype] | None:
    """The dtypes of ``tensors`` when :func:`all_dense_on_cpu` holds (its check and the dtypes in one pass over the
    list, where a hook runs at every step), else None."""
    if not set(map(type, tensors)) <= _PLAIN_TYPES:
        return None
    kinds = set(map(_kind, tensors))
    if all(layout is torch.strided and cpu and dtype.is_floating_point for layout, dtype, cpu in kinds):
        return {dtype for _, dtype, _ in kinds}
    return None


def dense(t: Tensor) -> Tensor | None:
    """A plain strided tensor whose L2 norm equals ``t``'s, or None when ``t``'s values cannot be read here.

    Sparse tensors give their coalesced values (duplicates summed first), quantized ones their dequantized
    values, a ``DTensor`` (FSDP2, tensor parallelism) its local shard (the norm of a shard, not of the whole: see
    docs/distributed.md on sharded parameters). Meta tensors hold no values and unknown tensor subclasses may not
    support the reductions: both give None, and the caller skips them with a warning.
    """
    if type(t) in _PLAIN and t.layout is torch.strided and not t.is_quantized:
        return None if t.is_meta else t
    if t.is_meta:
        return None
    to_local = getattr(t, "to_local", None)
    if callable(to_local):  # DTensor
        local = to_local()
        return dense(local) if isinstance(local, Tensor) and local is not t else None
    if t.is_sparse:
        return t.detach().coalesce().values()
    if t.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        return t.detach().values()
    if t.is_quantized:
        return t.dequantize()
    if type(t) not in _PLAIN:  # another subclass: usable only if it behaves as a plain tensor
        try:
            plain = t.as_subclass(Tensor)
        except Exception:
            return None
        return plain if plain.layout is torch.strided else None
    return None


def norms(tensors: Sequence[Tensor]) -> list[Tensor]:
    """L2 norm of each tensor, as 0-d float32 tensors, in as few kernel launches as possible.

    ``torch._foreach_norm`` reduces a whole list in one call; tensors are grouped by device and dtype so
    half-precision tensors are reduced in float32 (a float16 norm overflows at 65504), complex and float64
    tensors one by one. Every tensor must be plain and strided (see :func:`dense`). This runs in every fully
    observed step's hot path, so the common case (one device, float32) takes a short way.
    """
    grad = torch.is_grad_enabled()
    _set_grad_enabled(False)
    try:
        if all_float32(tensors):
            try:
                return list(torch._foreach_norm(list(tensors)))
            except RuntimeError:  # tensors on several devices
                pass
        return _grouped_norms(tensors)
    finally:
        _set_grad_enabled(grad)


def _by_device_and_dtype(
    tensors: Sequence[Tensor], reduce: Callable[[torch.dtype, list[Tensor]], Sequence[Tensor]]
) -> list[Tensor]:
    """``reduce(dtype, group)`` on each group of tensors sharing a device and a dtype, one result per tensor,
    returned in the order of ``tensors``."""
    out: list[Tensor | None] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    for (_, dtype), idx in groups.items():
        for i, r in zip(idx, reduce(dtype, [tensors[i] for i in idx])):
            out[i] = r
    return [r for r in out if r is not None]


def _norms_of_group(dtype: torch.dtype, group: list[Tensor]) -> Sequence[Tensor]:
    if dtype in _LOW_PRECISION:
        return torch._foreach_norm(group, 2, dtype=torch.float32)
    if dtype == torch.float32:
        return torch._foreach_norm(group)
    # float64, complex, integer: one by one (a complex norm is real)
    return [torch.linalg.vector_norm(_reducible(t)).float() for t in group]


def _grouped_norms(tensors: Sequence[Tensor]) -> list[Tensor]:
    return _by_device_and_dtype(tensors, _norms_of_group)


def _finite_probes_of_group(dtype: torch.dtype, group: list[Tensor]) -> Sequence[Tensor]:
    if dtype.is_floating_point and dtype.itemsize <= 4:
        return torch._foreach_norm(group, 2, dtype=torch.float64)
    return torch._foreach_norm(group, math.inf)


def device_finite_probes(tensors: Sequence[Tensor]) -> list[Tensor]:
    """One 0-d tensor per tensor, left on the device (read at a flush), that is inf or NaN exactly when the tensor
    holds an inf or a NaN (NaN when it holds a NaN): one ``torch._foreach_norm`` per device and dtype. Floats of 32
    bits or fewer take the L2 norm accumulated in float64, where no finite value can overflow (3.4e38 squared is
    1.2e77), about eight times cheaper on a CPU than the largest magnitude (``ord=inf``, which float64 tensors
    keep: their squares can overflow). Every tensor must be plain and strided (see :func:`dense`)."""
    with torch.no_grad():
        return _by_device_and_dtype(tensors, _finite_probes_of_group)


#: Up to this many norms are summed on the host (a CPU read each costs less than a stack and a sum).
_HOST_SUM = 8
#: :func:`_finite_readings`: float32 tensors of at least this many elements are summed alone rather than normed in
#: one call with the rest (per tensor, a sum costs ~0.4 us more than a norm and saves ~0.06 us per 1,000 elements).
_SUM_ALONE = 8192
#: :func:`flat_check_pays`: float32 tensors of at most this many elements on average, and at most
#: ``_FLAT_TOTAL`` in all, are summed as one flat copy rather than reduced one by one.
_FLAT_MEAN = 16_384
_FLAT_TOTAL = 1 << 22


def flat_check_pays(tensors: Sequence[Tensor]) -> bool:
    """Whether :func:`surely_finite` should sum ``tensors`` as one flat copy: all float32, small on average
    (a CPU reduces a list of tensors one tensor at a time, ~1.5 us each however small: 400 gradients of a
    200-layer MLP cost ~0.5 ms, a copy of their 0.4M values into one buffer and its sum ~0.2 ms) and small in all
    (the copy costs memory and time in proportion to the elements: an 8x512 MLP's 17 large gradients are cheaper
    one by one). Decided once per parameter list by the caller."""
    if not tensors or not all_float32(tensors):
        return False
    total = sum(t.numel() for t in tensors)
    return total <= _FLAT_TOTAL and total <= _FLAT_MEAN * len(tensors)


def surely_finite(tensors: Sequence[Tensor], flat: bool = False, plan: FlatSum | None = None) -> bool:
    """True when every CPU tensor surely holds only finite values: the sum of one reduction per tensor (see
    :func:`_finite_readings`: L2 norms in one call, plain sums for large float32 tensors), read at once, is finite.
    False says only "look closer": a norm of finite float32 values overflows above 1.8e19, a sum above 3.4e38 (use
    :func:`device_finite_probes` then, which cannot). Every tensor must be plain, strided and on the CPU.

    ``flat`` (see :func:`flat_check_pays`; every tensor float32): the sum of all their values, copied into one
    buffer in one call, instead: an inf or a NaN makes it non-finite (inf - inf is NaN), and finite values make it
    inf only when they overflow float32 (a closer look then clears them, as for a norm). ``plan``, with ``flat``: the
    :class:`FlatSum` of these tensors' shapes, which takes that sum in fewer copies."""
    if not tensors:
        return True
    if not flat:
        found = _finite_readings(tensors)
        if len(found) <= _HOST_SUM:
            return math.isfinite(sum(float(n) for n in found))
    grad = torch.is_grad_enabled()
    _set_grad_enabled(False)
    try:
        if not flat:
            total = torch.stack(found).sum()
        elif plan is not None and plan.size == len(tensors):
            total = plan.total(tensors)
        else:
            total = _flatten(list(tensors)).sum()
        return math.isfinite(float(total))
    finally:
        _set_grad_enabled(grad)


def _finite_readings(tensors: Sequence[Tensor]) -> list[Tensor]:
    """For :func:`surely_finite`'s long way, 0-d tensors whose sum is non-finite when a value of ``tensors`` is:
    the norms of all of them (:func:`norms`), except that a float32 list's tensors of at least ``_SUM_ALONE``
    elements are summed one by one instead. A CPU sums float32 about twice as fast as it takes a norm (an 8x512
    MLP's 16 gradients: 135 us against 255 us), and the sum of finite values overflows only above 3.4e38, where
    their norm does above 1.8e19; a norm call costs less per tensor, so small tensors keep it."""
    large = [t for t in tensors if t.numel() >= _SUM_ALONE] if all_float32(tensors) else []
    if not large:
        return norms(tensors)
    small = [t for t in tensors if t.numel() < _SUM_ALONE]
    grad = torch.is_grad_enabled()
    _set_grad_enabled(False)
    try:
        return [t.sum() for t in large] + (norms(small) if small else [])
    finally:
        _set_grad_enabled(grad)


def probe_sum(probes: Sequence[Tensor]) -> Tensor | None:
    """The sum of :func:`device_finite_probes`' probes as one 0-d tensor, non-finite exactly when one of them is
    (a sum of finite probes can overflow only past float64's range: then the probes themselves are read, and are
    finite). None when they lie on several devices."""
    if not probes:
        return None
    with torch.no_grad():
        if len(probes) == 1:
            return probes[0]
        try:
            return torch.stack(list(probes)).sum()
        except RuntimeError:  # several devices
            return None


def host_norm(t: Tensor) -> float | None:
    """The L2 norm of a tensor as a Python float (a host read: on a GPU, a sync; used on CPU tensors); None when its
    values cannot be read here (see :func:`dense`; a sparse tensor is read through its values). A half-precision
    tensor is reduced in float32: the norm of float16 values overflows at 65504 long before any of them does (a
    scaled loss gradient, an autocast output)."""
    plain = readable(t)
    if plain is None:
        return None
    # on a detached tensor nothing is recorded for autograd: no grad-mode switch needed
    return float(torch.linalg.vector_norm(plain.detach(), dtype=accumulation_dtype(plain)))


def accumulation_dtype(t: Tensor) -> torch.dtype | None:
    """The dtype a norm of ``t`` is accumulated in: float32 for half precisions (their own overflows at 65504),
    None (``t``'s own) for the others; a float64 tensor cannot be reduced into float32 (torch refuses to narrow)."""
    return torch.float32 if t.dtype in _LOW_PRECISION else None


def unit_dim(t: Tensor, channel_first: bool) -> int:
    """The dimension that indexes units: features (last) for dense outputs, channels (1) for conv maps."""
    if t.dim() <= 2:
        return t.dim() - 1
    return 1 if channel_first else t.dim() - 1


def dead_units(t: Tensor, channel_first: bool, sample_fraction: float) -> Tensor:
    """Number of units active (> 0) on at most ``sample_fraction`` of the samples, as a 0-d float32 tensor.

    A sample is one element of the batch (dim 0); a unit of a conv map is active on a sample when it is
    positive anywhere on that sample's map, so sparse but healthy feature detectors are not called dead.
    """
    t = t.detach()  # nothing below is recorded for autograd
    if t.dim() < 2:  # no batch dimension: every element is a unit, observed on one sample
        return (t <= 0).sum(dtype=torch.float32)
    u = unit_dim(t, channel_first)
    other = [d for d in range(1, t.dim()) if d != u]
    per_sample = t.amax(dim=other) if other else t  # [batch, units]
    allowed = int(sample_fraction * per_sample.shape[0])
    if allowed == 0:  # dead = positive on no sample: the largest value over the batch says it, 10x cheaper
        return (per_sample.amax(dim=0) <= 0).sum(dtype=torch.float32)
    active = (per_sample > 0).sum(dim=0, dtype=torch.int32)
    return (active <= allowed).sum(dtype=torch.float32)


def unit_count(t: Tensor, channel_first: bool) -> int:
    """The number of units :func:`dead_units` counts over: the size of the unit dimension, or every element of
    an output without a batch dimension."""
    return t.numel() if t.dim() < 2 else int(t.shape[unit_dim(t, channel_first)])


def never_positive(t: Tensor, channel_first: bool) -> Tensor:
    """Boolean per unit: the unit's output is <= 0 on every element of the batch (a pre-activation that a
    following ReLU would zero everywhere). One reduction over every other dimension, in place: moving a
    channel-first map's channels last would copy it whole first (a 64x128x32x32 map on a CPU: 17 ms with the
    copy, 1.3 ms without). The dimensions after the units' are reduced first, over contiguous memory, then those
    before them: a CPU takes a channel-first map's largest values over batch and space at once twice as slowly
    (64x64x32x32: 0.55 ms against 0.26 ms), and the largest value is the same whatever the order (a NaN included)."""
    t = t.detach()
    if t.dim() < 2:
        return (t <= 0).reshape(-1)
    unit = unit_dim(t, channel_first)
    if unit + 1 < t.dim():
        t = t.amax(dim=list(range(unit + 1, t.dim())))
    return t.amax(dim=list(range(unit))) <= 0


def other_dims(t: Tensor, unit: int) -> list[int]:
    """Every dimension of ``t`` but ``unit``: what a per-unit reduction reduces."""
    return [d for d in range(t.dim()) if d != unit]


def zero_gradient_units(grad: Tensor) -> Tensor:
    """Boolean per output unit (row of a weight's gradient): the unit received exactly zero gradient."""
    rows = grad.detach().reshape(grad.shape[0], -1)
    # the largest and the smallest element apart: a CPU takes torch.aminmax along a dimension 3-10x slower than
    # the two reductions (a 512x512 weight's gradient: 0.57 ms against 0.05 ms); the same answer, NaN included
    return (rows.amax(dim=1) == 0) & (rows.amin(dim=1) == 0)


def dead_and_still_stacked(never: Tensor, grads: Tensor) -> Tensor:
    """For ``k`` layers of one shape: how many of each layer's units are never positive (``never``, ``[k, units]``,
    :func:`never_positive` of each) and received exactly zero gradient (``grads``, ``[k, units, ...]``, the weight
    gradients stacked, one row per unit: :func:`zero_gradient_units` of each), as a float32 ``[k]`` tensor."""
    k, units = grads.shape[0], grads.shape[1]
    still = zero_gradient_units(grads.reshape(k * units, -1)).reshape(k, units)
    return (never & still).sum(dim=1, dtype=torch.float32)


def saturated_count(t: Tensor, center: float, radius: float) -> Tensor:
    """Number of elements with ``|t - center| >= radius`` (at or beyond a saturating bound), as float32."""
    t = t.detach()
    d = t - center if center else t
    return (d.abs() >= radius).sum(dtype=torch.float32)


def largest_magnitudes(tensors: Sequence[Tensor]) -> list[float]:
    """max |t| of each tensor, moved to the host in one transfer: 0 only for an exactly-zero tensor (a norm of 0
    can also be an underflow), non-finite only when an element is (a norm of inf can also be an overflow)."""
    if not tensors:
        return []
    readings = norm_readings(tensors, math.inf)
    return readings.tolist() if isinstance(readings, Tensor) else to_host(readings)


#: The fixed weights of :func:`sample_prints`, by (features, device, dtype).
_PRINT_WEIGHTS: dict[tuple[int, torch.device, torch.dtype], Tensor] = {}


def sample_prints(batch: Tensor) -> Tensor | None:
    """One number per sample of ``batch`` (its first dimension), on its device: the sample's values weighed by fixed
    pseudo-random weights in [0.5, 1.5] and summed, in one matrix-vector product (float32 for integer ids and
    half precisions; the same sample gives the same number in any batch up to rounding, two different ones almost
    never do). None for a batch without two samples or without values."""
    if batch.dim() < 1 or batch.shape[0] < 2 or batch.is_sparse or batch.is_complex() or type(batch) is not Tensor:
        return None
    rows = batch if batch.dim() == 2 else batch.reshape(batch.shape[0], -1)  # a reshape costs a dispatch a step
    if not rows.shape[1]:
        return None
    if rows.requires_grad:
        rows = rows.detach()
    if rows.dtype not in (torch.float32, torch.float64):
        rows = rows.float()
    key = (rows.shape[1], rows.device, rows.dtype)
    weights = _PRINT_WEIGHTS.get(key)
    if weights is None:
        g = torch.Generator().manual_seed(rows.shape[1])
        weights = (torch.rand(rows.shape[1], generator=g) + 0.5).to(rows.device, rows.dtype)
        _PRINT_WEIGHTS[key] = weights
    return torch.mv(rows, weights)


def sample_outcomes(values: Tensor, target: Tensor, ignore: int, samples: int) -> tuple[Tensor, Tensor] | None:
    """Each sample's own ``nll_loss`` on the device: minus its target's entry of ``values`` (rows of
    log-probabilities, ``(rows, classes)``), averaged over the sample's rows when each of ``samples`` samples has
    several (a tagger's tokens, sample after sample), leaving out ``ignore``; and its hit, the share of those rows
    whose largest entry is its target's (1 or 0 for a sample of one row). NaN for a sample whose rows are all
    ignored. None when the rows are not a whole number of rows per sample."""
    rows = values.shape[0]
    if values.dim() != 2 or target.shape != (rows,) or samples < 1 or rows % samples:
        return None
    kept = target != ignore
    detached = values.detach()
    picked = detached.float().gather(1, torch.where(kept, target, 0).unsqueeze(1)).squeeze(1)
    # max(1)'s indices are argmax(1)'s (the first of tied largest entries, a NaN's first), ~3x cheaper on a CPU
    hit = detached.max(1).indices == target
    if rows == samples:  # one row each (a classifier): the row's own, NaN where ignored (half the operations)
        return torch.where(kept, -picked, math.nan), torch.where(kept, hit.float(), math.nan)
    losses = torch.where(kept, -picked, 0.0).view(samples, -1).sum(1)
    hits = (hit & kept).view(samples, -1).sum(1).float()
    counts = kept.view(samples, -1).sum(1)
    return losses / counts, hits / counts  # 0 / 0: NaN


def wide_norm(t: Tensor) -> float:
    """The 2-norm of ``t`` accumulated in float64, read on the host: finite for any finite tensor, where a float32
    norm overflows once an element passes ~1.8e19 (its square passes float32's largest value). For the rare tensor
    whose own-precision norm came back inf with every element finite."""
    return float(torch.linalg.vector_norm(t.detach(), dtype=torch.float64))


# --- many tensors at once ---------------------------------------------------------------------------------------
#
# On a CPU every kernel launch costs a few microseconds of dispatch whatever the tensor's size, and the
# ``torch._foreach_*`` functions run one kernel per tensor there. A model of many small layers (200 Linear(32, 32)
# layers: 402 parameter tensors, 400 layer outputs) would pay that per tensor several times per fully observed
# step. Tensors of one shape are reduced together instead: one ``torch.stack`` and one reduction per shape,
# whatever their number. The results are bit for bit those of one reduction per tensor (same kernel, same order:
# only contiguous tensors are stacked, a strided one is reduced in its own order).

#: Tensors of one shape are stacked and reduced together in groups of at least this many (below, a stack, a
#: reduction and a reordering cost about what ``_foreach_norm`` does) ...
MIN_GROUP = 8
#: ... each of at most this many elements: above, the copy a stack makes costs more than the launches it saves.
#: Timed alone on one CPU thread, the norms of 17 tensors: at 8,192 elements each, a stack and one reduction 25 us,
#: one ``_foreach_norm`` 33 us; at 12,288, 39 us and 35 us; at 65,536, 508 us and 181 us (in the loop of the 8x512
#: MLP, whose layer outputs have 65,536 elements, its fully observed step's output norms 0.85-0.92 -> 0.49-0.52 ms).
STACK_LIMIT = 1 << 13

_PLANS: dict[tuple[tuple[torch.Size, ...], tuple[bool, ...]], NormPlan] = {}


def _by_shape(
    shapes: Sequence[torch.Size], eligible: Sequence[bool] | None = None, limit: int | None = None
) -> tuple[list[list[int]], list[int]]:
    """The indices of tensors of these shapes that are stacked together, by shape: groups of at least
    :data:`MIN_GROUP` (among the ``eligible`` ones, each of at most ``limit`` elements); and the others, in order."""
    groups: dict[torch.Size, list[int]] = {}
    for i, shape in enumerate(shapes):
        if eligible is None or eligible[i]:
            groups.setdefault(shape, []).append(i)
    stacked = [
        idx
        for shape, idx in groups.items()
        if len(idx) >= MIN_GROUP and (limit is None or 0 < math.prod(shape) <= limit)
    ]
    taken = {i for idx in stacked for i in idx}
    return stacked, [i for i in range(len(shapes)) if i not in taken]


class NormPlan:
    """How to take a norm of each tensor of a list of fixed shapes in few kernel launches: contiguous float32
    tensors of one shape (at least :data:`MIN_GROUP` of them, each at most :data:`STACK_LIMIT` elements) are
    stacked and reduced in one call per shape; the others go through one ``_foreach_norm``. Plans are kept by the
    list's shapes and contiguity."""

    def __init__(self, shapes: Sequence[torch.Size], contiguous: Sequence[bool]) -> None:
        self.stacked, self.singles = _by_shape(shapes, contiguous, STACK_LIMIT)
        order = [i for idx in self.stacked for i in idx] + self.singles
        inverse = [0] * len(order)
        for position, i in enumerate(order):
            inverse[i] = position
        self._inverse = None if order == list(range(len(order))) else torch.tensor(inverse)
        self._on: dict[torch.device, Tensor] = {}

    @staticmethod
    def of(tensors: Sequence[Tensor]) -> NormPlan:
        shapes, contiguous = tuple(map(_shape, tensors)), tuple(map(_contiguous, tensors))
        plan = _PLANS.get((shapes, contiguous))
        if plan is None:
            if len(_PLANS) >= 64:
                _PLANS.clear()
            plan = _PLANS[(shapes, contiguous)] = NormPlan(shapes, contiguous)
        return plan

    def norms(self, tensors: Sequence[Tensor], ord: float = 2.0) -> Tensor:
        """One float32 norm per tensor (float32 tensors on one device), as one 1-d tensor in input order."""
        parts: list[Tensor] = []
        for idx in self.stacked:
            rows = torch.stack([tensors[i] for i in idx]).view(len(idx), -1)
            if ord == math.inf:  # see _largest
                parts.append(torch.maximum(rows.amax(dim=1), rows.amin(dim=1).neg()))
            else:
                parts.append(torch.linalg.vector_norm(rows, ord, dim=1))
        if self.singles:
            singles = [tensors[i] for i in self.singles]
            parts.append(torch.stack(_largest(singles) if ord == math.inf else torch._foreach_norm(singles, ord)))
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        inverse = self._inverse
        if inverse is None:
            return out
        on = self._on.get(out.device)
        if on is None:
            on = self._on[out.device] = inverse.to(out.device)
        return out[on]


class FlatSum:
    """How to sum every value of a fixed list of small float32 tensors (a parameter list's gradients, see
    :func:`flat_check_pays`) with few copies. A CPU copies a list of tensors into one buffer at about a
    microsecond per tensor however small (the 5,000 gradients of 2,500 Linear(8, 8) layers: 2.2 ms), and stacks
    tensors of one shape at a fraction of that (0.7 ms for the same). So tensors of one shape, in groups of at
    least :data:`MIN_GROUP`, are stacked and summed shape by shape, the others copied into one buffer and summed,
    and the partial sums added. Like the one flat copy's sum, the total is non-finite when any value is, and
    finite values make it inf only when they overflow. Planned once from the tensors' shapes (a gradient has its
    parameter's); a list whose shapes no longer fit the plan (a parameter given new data of another shape) is
    summed as one flat copy."""

    def __init__(self, shapes: Sequence[torch.Size]) -> None:
        stacked, rest = _by_shape(shapes)
        self.size = len(shapes)
        self.groups = [len(idx) for idx in stacked]  # how many tensors each stack holds
        self.rest = len(rest)  # how many go into the flat copy
        self._stacked = [_picker(idx) for idx in stacked]
        self._rest = _picker(rest) if rest else None

    def total(self, tensors: Sequence[Tensor]) -> Tensor:
        """The sum of every value of ``tensors`` (as many as planned) as a 0-d tensor."""
        try:
            parts = [torch.stack(pick(tensors)).sum() for pick in self._stacked]
        except RuntimeError:  # shapes that no longer fit the plan
            return _flatten(list(tensors)).sum()
        if self._rest is not None:
            parts.append(_flatten(self._rest(tensors)).sum())
        return parts[0] if len(parts) == 1 else torch.stack(parts).sum()


def _picker(idx: list[int]) -> Callable[[Sequence[Tensor]], tuple[Tensor, ...]]:
    """A function that picks the tensors at ``idx`` from a list, as a tuple, in one C call (``itemgetter``)."""
    if len(idx) == 1:
        i = idx[0]
        return lambda tensors: (tensors[i],)
    return itemgetter(*idx)


#: The integer type of each element size, to read a tensor's bits as integers.
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bit_sums(tensors: Sequence[Tensor]) -> list[int]:
    """A checksum of each tensor's values: the sum of their bit patterns read as integers (in int64, wrapping).
    Any change of any element changes it (a norm misses a change below its precision, or rows swapped), bar
    changes that cancel exactly; one reduction per tensor, one transfer per device."""
    if not tensors:
        return []
    grad = torch.is_grad_enabled()
    _set_grad_enabled(False)
    try:
        sums = [t.view(_BITS[t.element_size()]).sum(dtype=torch.int64) for t in tensors]
        devices = {s.device for s in sums}
        if len(devices) == 1:
            return [int(v) for v in torch.stack(sums).tolist()]
        return [int(s.item()) for s in sums]
    finally:
        _set_grad_enabled(grad)


def norm_readings(tensors: Sequence[Tensor], ord: float = 2.0) -> Tensor | list[Tensor]:
    """A norm of each tensor (L2 by default, ``math.inf`` for the largest magnitude) in float32, in as few kernel
    launches as possible: one 1-d tensor, or a list of 0-d tensors when they lie on several devices (each device
    reduces its own). Half-precision tensors are reduced in float32 (a float16 L2 norm overflows at 65504)."""
    grad = torch.is_grad_enabled()
    _set_grad_enabled(False)
    try:
        if len(tensors) and all_float32(tensors):
            try:
                if len(tensors) < MIN_GROUP:  # no group to stack: one _foreach_norm
                    every = list(tensors)
                    return torch.stack(_largest(every) if ord == math.inf else torch._foreach_norm(every, ord))
                return NormPlan.of(tensors).norms(tensors, ord)
            except RuntimeError:  # tensors on several devices
                pass
        if ord == 2.0:
            values = norms(tensors)
        else:
            # a complex tensor is reduced as it is (its norm is of the magnitudes): cast to float it would lose its
            # imaginary part, an inf or NaN there with it, and torch would warn in the user's run
            values = [torch.linalg.vector_norm(_reducible(t), ord).float() for t in tensors]
        try:
            return torch.stack(values) if values else torch.zeros(0)
        except RuntimeError:  # several devices
            return values
    finally:
        _set_grad_enabled(grad)


#: A real floating CPU tensor of at least this many elements has its largest magnitude, whether it holds a nonzero
#: and whether it holds a NaN taken from its largest and smallest values (see :func:`_largest`); smaller ones cost
#: less through torch's one call, and a GPU's tensors (not measured) keep it.
MAGNITUDE_APART = 4096


def _apart(t: Tensor) -> bool:
    """Whether ``t``'s largest magnitude, nonzero and NaN tests are taken from its largest and smallest values."""
    return t.is_cpu and t.is_floating_point() and t.numel() >= MAGNITUDE_APART


def largest_magnitude(t: Tensor) -> Tensor:
    """max |t| as a 0-d tensor on its device, in its dtype (see :func:`_largest`): a real floating tensor of at least
    :data:`MAGNITUDE_APART` elements by its largest and smallest values (a 512x512 one: 0.05 ms, its inf norm 0.8
    ms), a smaller one or a complex one by ``vector_norm(inf)`` (a complex tensor's moduli), an integer one by its
    absolute values. Not for an empty tensor."""
    if _apart(t):
        return torch.maximum(t.amax(), t.amin().neg())
    if t.is_floating_point() or t.is_complex():
        norm: Tensor = torch.linalg.vector_norm(t, math.inf)
        return norm
    return t.abs().amax()


def any_nonzero(t: Tensor) -> bool:
    """``bool(t.any())``, a NaN counting as nonzero: for a large real floating tensor, whether its largest or its
    smallest value is not 0 (a CPU's ``any`` of a 512x512 float tensor: 0.6 ms, the two reductions 0.04 ms)."""
    if _apart(t):
        return bool((t.amax() != 0) | (t.amin() != 0))
    return bool(t.any())


def has_nan(t: Tensor) -> Tensor:
    """Whether ``t`` holds a NaN, as a 0-d bool tensor on its device: for a large real floating tensor, whether its
    largest value is NaN (``amax`` propagates a NaN; ``isnan(t).any()`` makes a mask of the whole tensor first)."""
    if _apart(t):
        return t.amax().isnan()
    return torch.isnan(t).any()


def _largest(tensors: list[Tensor]) -> list[Tensor]:
    """max |t| of each float32 tensor, as 0-d tensors: :func:`largest_magnitude` for those :func:`_apart` says, one
    ``_foreach_norm(inf)`` for the others. The same values (a NaN gives NaN, an inf or a -inf inf), where a CPU takes
    the inf norm of a large tensor thirty times slower (an 8x512 MLP's 16 gradients: 10.6 ms against 0.3 ms) and its
    absolute values copy the tensor first; along a dimension, vector_norm(inf) is ten times slower (200 rows of
    1,024: 0.8 ms against 0.03 ms)."""
    large = [i for i, t in enumerate(tensors) if _apart(t)]
    if not large:
        return list(torch._foreach_norm(tensors, math.inf))
    out: list[Tensor | None] = [None] * len(tensors)
    taken = set(large)
    small = [i for i in range(len(tensors)) if i not in taken]
    if small:
        for i, value in zip(small, torch._foreach_norm([tensors[i] for i in small], math.inf)):
            out[i] = value
    for i in large:
        out[i] = largest_magnitude(tensors[i])
    return [value for value in out if value is not None]


def _reducible(t: Tensor) -> Tensor:
    """``t`` as ``vector_norm`` takes it: floating and complex tensors as they are, integer and bool ones as float."""
    return t if t.is_floating_point() or t.is_complex() else t.float()


def dead_units_stacked(s: Tensor, channel_first: bool, sample_fraction: float) -> Tensor:
    """:func:`dead_units` of each of ``k`` outputs of one shape stacked as ``s`` (``[k, *shape]``): a 1-d tensor."""
    s = s.detach()
    k, dims = s.shape[0], s.dim() - 1
    if dims < 2:
        return (s.reshape(k, -1) <= 0).sum(dim=1, dtype=torch.float32)
    u = (1 if channel_first and dims > 2 else dims - 1) + 1
    other = [d for d in range(2, s.dim()) if d != u]
    per_sample = s.amax(dim=other) if other else s  # [k, batch, units]
    allowed = int(sample_fraction * per_sample.shape[1])
    if allowed == 0:
        return (per_sample.amax(dim=1) <= 0).sum(dim=1, dtype=torch.float32)
    active = (per_sample > 0).sum(dim=1, dtype=torch.int32)
    return (active <= allowed).sum(dim=1, dtype=torch.float32)


def saturated_stacked(s: Tensor, center: float, radius: float) -> Tensor:
    """:func:`saturated_count` of each of ``k`` outputs of one shape stacked as ``s``: a 1-d tensor."""
    s = s.detach()
    d = s - center if center else s
    return (d.abs() >= radius).reshape(s.shape[0], -1).sum(dim=1, dtype=torch.float32)


#: Elements of a parameter a snapshot copies at most (an evenly strided sample of a bigger one).
SAMPLE = 1 << 16


class SnapshotPlan:
    """Which elements of some parameters a :class:`Snapshot` copies, and how, fixed once for a list of parameters.

    Each parameter contributes an evenly strided sample of at most ``sample`` elements (the whole parameter when
    it is smaller: then its change is exact). When there are at least :data:`MIN_GROUP` of them, all float32 on
    one device, the samples are *packed*: one ``torch.cat`` copies them all, ordered by size (parameters copied
    whole first, then sampled ones), so the change of every parameter of one size is one row of one reduction.
    A plan holds views of the parameters: it stays valid while they keep their storage (:meth:`valid_for`), so
    the caller can keep it from step to step (``param.data = ...`` replaces the storage and asks for a new one).
    """

    def __init__(self, names: Sequence[str], params: Sequence[Tensor], sample: int = SAMPLE) -> None:
        detached = [p.detach() for p in params]
        views = [_sample(p, sample) for p in detached]
        self.names = list(names)
        self.scales = [scale for _, scale in views]
        self.params = detached
        self.sampled = [i for i, scale in enumerate(self.scales) if scale != 1.0]
        self._ptrs = [p.data_ptr() for p in detached]
        flat = [v.view(-1) if v.dim() != 1 and v.is_contiguous() else v for v, _ in views]
        device = flat[0].device if flat else None
        self.packed = (
            len(flat) >= MIN_GROUP and all_float32(flat) and all(v.dim() == 1 and v.device == device for v in flat)
        )
        # packed order: whole parameters by size, then sampled ones by size
        order = sorted(range(len(flat)), key=lambda i: (self.scales[i] != 1.0, flat[i].numel()))
        self._views = flat if not self.packed else [flat[i] for i in order]
        sizes = [flat[i].numel() for i in order]
        self._whole = len(flat) - len(self.sampled)
        self._sampled_packed = order[self._whole :]  # the sampled parameters, in packed order
        self._segments: list[tuple[int, int]] = []  # (count, size) of consecutive packed samples of one size
        for size in sizes:
            if self._segments and self._segments[-1][1] == size:
                self._segments[-1] = (self._segments[-1][0] + 1, size)
            else:
                self._segments.append((1, size))
        inverse = [0] * len(order)
        for position, i in enumerate(order):
            inverse[i] = position
        self._inverse = torch.tensor(inverse, device=device) if self.packed and order != sorted(order) else None

    def valid_for(self, params: Sequence[Tensor]) -> bool:
        """The same parameters, with the same storage (``param.data = ...`` replaces it)."""
        return len(params) == len(self._ptrs) and all(p.data_ptr() == ptr for p, ptr in zip(params, self._ptrs))

    def take(self) -> Snapshot:
        """Copy the parameters' samples now (before the optimizer step)."""
        return Snapshot(self.names, self.params, plan=self)

    def pack(self) -> Tensor:
        return torch.cat(self._views)

    def segment_norms(self, packed: Tensor, count: int) -> Tensor:
        """The norm of each of the first ``count`` packed samples, in packed order."""
        parts: list[Tensor] = []
        singles: list[int] = []
        offset = done = 0
        for n, size in self._segments:
            if done >= count:
                break
            n = min(n, count - done)
            if n > 1:
                if singles:
                    parts.append(_split_norms(packed, offset - sum(singles), singles))
                    singles = []
                parts.append(torch.linalg.vector_norm(packed[offset : offset + n * size].view(n, size), dim=1))
            else:
                singles.append(size)
            offset += n * size
            done += n
        if singles:
            parts.append(_split_norms(packed, offset - sum(singles), singles))
        if not parts:
            return packed.new_zeros(0)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def weight_norms(self, packed: Tensor) -> Tensor:
        """The norm of every parameter, in :attr:`names` order, given a :meth:`pack` taken now: a parameter copied
        whole reads its packed copy, a sampled one the whole parameter."""
        weights = self.segment_norms(packed, self._whole)
        if self.sampled:
            whole = norm_readings([self.params[i] for i in self._sampled_packed])
            assert isinstance(whole, Tensor)  # packed parameters lie on one device
            weights = torch.cat([weights, whole])
        return weights[self._inverse] if self._inverse is not None else weights


def _split_norms(packed: Tensor, start: int, sizes: list[int]) -> Tensor:
    pieces = torch.split(packed[start : start + sum(sizes)], sizes)
    return torch.stack(torch._foreach_norm(list(pieces)))


class Snapshot:
    """What the optimizer will do to some parameters, measured without copying them all.

    Before the step: a copy of an evenly strided sample of at most ``sample`` elements per parameter (the whole
    parameter when it is smaller: then its change is exact), and the norm of each parameter (one batched
    reduction). After the step, :meth:`readings` gives per parameter the sample change's norm, the new norm and the
    old norm, all batched; :func:`update_norm` turns them into ||dW||: the sample's
    change scaled to the whole parameter or, when the sample did not change but the norm did (a sparse update the
    sample missed), the change of the norm, which bounds ||dW|| from below. A parameter is unchanged (exactly 0)
    only when its sample and its norm both are. ``plan``: a :class:`SnapshotPlan` of these parameters kept from
    an earlier step (see there).
    """

    def __init__(
        self,
        names: Sequence[str],
        params: Sequence[Tensor],
        sample: int = SAMPLE,
        plan: SnapshotPlan | None = None,
    ) -> None:
        plan = plan if plan is not None else SnapshotPlan(names, params, sample)
        self.plan = plan
        self.names = plan.names
        self.scales = plan.scales
        grad = torch.is_grad_enabled()
        _set_grad_enabled(False)
        try:
            # every parameter's norm before the step (a sampled one's also bounds a change its sample missed),
            # reduced as its norm after the step will be: an unchanged parameter reads the same norm twice
            self._before: Tensor | list[Tensor]
            if plan.packed:
                self._copy: Tensor | list[Tensor] = plan.pack()
                self._before = plan.weight_norms(self._copy)
            else:
                self._copy = list(torch._foreach_mul(plan._views, 1.0)) if plan._views else []  # one copy
                self._before = norm_readings(plan.params) if plan.params else []
        finally:
            _set_grad_enabled(grad)

    def readings(self) -> tuple[Tensor | list[Tensor], Tensor | list[Tensor], Tensor | list[Tensor]]:
        """(sample change norms, norms after, norms before) of every parameter in :attr:`names` order: 1-d
        tensors, or lists of 0-d tensors for parameters on several devices."""
        plan = self.plan
        grad = torch.is_grad_enabled()
        _set_grad_enabled(False)
        try:
            if isinstance(self._copy, Tensor):
                after = plan.pack()
                deltas = plan.segment_norms(after - self._copy, len(plan.names))
                if plan._inverse is not None:
                    deltas = deltas[plan._inverse]
                return deltas, plan.weight_norms(after), self._before
            return (
                norm_readings(list(torch._foreach_sub(plan._views, self._copy))),
                norm_readings(plan.params) if plan.params else [],
                self._before,
            )
        finally:
            _set_grad_enabled(grad)

    def changes(self) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """:meth:`readings` as one 0-d tensor per parameter: (sample change norms, norms after, norms before)."""
        deltas, after, before = self.readings()
        return list(deltas), list(after), list(before)


def _sample(p: Tensor, limit: int) -> tuple[Tensor, float]:
    """A strided view of at most ``limit`` elements of ``p`` and the factor that scales its norms to ``p``."""
    n = p.numel()
    if n <= limit or not p.is_contiguous():
        return p, 1.0
    stride = -(-n // limit)
    view = p.view(-1)[::stride]
    return view, math.sqrt(n / view.numel())


def update_norm(sample_delta: float, scale: float, after: float, before: float) -> float:
    """||dW|| from a :class:`Snapshot` reading (see there)."""
    if sample_delta > 0 or math.isnan(sample_delta):
        return sample_delta * scale
    return abs(after - before)


def host_values(*readings: Tensor | Sequence[Tensor] | None) -> list[float]:
    """The values of several :func:`norm_readings` results (None: none), in order, in one transfer per device."""
    parts = [r for r in readings if r is not None]
    vectors = [r for r in parts if isinstance(r, Tensor)]
    if len(vectors) == len(parts):
        try:
            return list((torch.cat(vectors) if len(vectors) > 1 else vectors[0]).tolist()) if vectors else []
        except RuntimeError:  # several devices
            pass
    flat: list[Tensor] = []
    for r in parts:
        flat.extend(r.unbind(0) if isinstance(r, Tensor) else r)
    return to_host(flat)


def to_host_parts(scalars: Sequence[Tensor], vectors: Sequence[Tensor]) -> list[float]:
    """0-d tensors, then the elements of 1-d tensors, moved to the host in one transfer (one per device)."""
    if not vectors:
        return to_host(scalars)
    try:
        parts = [torch.stack(list(scalars)), *vectors] if scalars else list(vectors)
        return list(torch.cat(parts).tolist()) if len(parts) > 1 else list(parts[0].tolist())
    except RuntimeError:  # several devices (or dtypes torch.cat does not promote)
        out = to_host(scalars)
        for v in vectors:
            out.extend(v.tolist())
        return out


def to_host(tensors: Iterable[Tensor]) -> list[float]:
    """Move 0-d tensors to the host in one transfer per device, preserving order."""
    items = list(tensors)
    if not items:
        return []
    try:  # one device (the common case): one stack, which promotes mixed dtypes, and one transfer
        return list(torch.stack(items).tolist())
    except RuntimeError:  # tensors on several devices
        devices = {t.device for t in items}
    out: list[float] = [0.0] * len(items)
    for device in devices:
        idx = [i for i, t in enumerate(items) if t.device == device]
        values = torch.stack([items[i].float() for i in idx]).tolist()
        for i, v in zip(idx, values):
            out[i] = v
    return out


def target_moments(target: Tensor, binary: bool) -> tuple[Tensor, Tensor]:
    """A loss's targets profiled per column (dimension 0 holds the samples, the rest is flattened into columns, one
    value), on their device (read later): a ``(3, columns)`` float64 tensor [samples, sum, sum of squares] and, as
    a 0-d tensor, how many values lie outside [0, 1] (``binary``: a binary cross-entropy's targets; 0 otherwise).
    A non-finite value makes the sums non-finite, and the level they give is then not judged. A few kernels,
    nothing waits for the device; float64 sums keep the variance exact enough for targets far from 0."""
    t = target.detach()
    t = (t.reshape(t.shape[0], -1) if t.dim() else t.reshape(1, 1)).double()
    sums = torch.stack((torch.full_like(t[0], float(t.shape[0])), t.sum(0), (t * t).sum(0)))
    outside = ((t < 0) | (t > 1)).sum() if binary else t.new_zeros(())
    return sums, outside


def merge_moments(a: Tensor, b: Tensor) -> Tensor:
    """Two readings of :func:`target_moments`' per-column sums, added up."""
    return a + b


def target_baseline(moments: Tensor, outside: Tensor, binary: bool) -> Tensor:
    """The loss of a model that learned nothing from its inputs, from the targets' per-column sums
    (:func:`target_moments`), as one 1-d float tensor on their device (read later): [the per-column chance level,
    the pooled one, the samples per column, the values outside [0, 1], the values' root-mean-square]. For a mean
    squared error (``binary`` False) the levels are the mean of the columns' variances (the loss of predicting each
    column's mean) and the variance of all the values (predicting one mean); for a binary cross-entropy, the mean
    binary entropy of the columns' base rates, in nats, with the Miller-Madow correction (+ 1 / 2n for a rate
    strictly between 0 and 1: a plug-in estimate from n labels is biased low), and the binary entropy of the pooled
    rate."""
    n, total, squares = moments
    samples = n[0] if n.numel() else n.new_zeros(())
    count = n.clamp(min=1)
    mean = total / count
    if binary:
        p = mean.clamp(0, 1)
        entropy = -(torch.special.xlogy(p, p) + torch.special.xlogy(1 - p, 1 - p))
        entropy = entropy + ((p > 0) & (p < 1)).double() / (2 * count)
        pooled = p.mean()
        whole = -(torch.special.xlogy(pooled, pooled) + torch.special.xlogy(1 - pooled, 1 - pooled))
        level = entropy.mean()
    else:
        level = (squares / count - mean * mean).clamp(min=0).mean()
        everything = count.sum()
        whole = (squares.sum() / everything - (total.sum() / everything) ** 2).clamp(min=0)
    rms = (squares.sum() / count.sum()).sqrt()
    return torch.stack((level, whole, samples, outside.to(level.dtype), rms.to(level.dtype))).float()
