"""Explanations in words: what failed, where, over which steps, the numbers, what it caused, what to change.

The fixes follow what users act on (DeepDiagnosis' decision tree): weights off -> change the initialisation;
update/weight ratio off -> change the learning rate; data non-finite -> check the input batch at that step;
otherwise a symptom-specific default (normalisation, residual connections, clipping, another activation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..events import EventType, FailureKind, SemanticEvent
from .topology import Topology

Series = Callable[[str, str], list[tuple[int, float]]]


def num(x: float) -> str:
    """A number as people read it in a diagnosis: 3e-18, 0.12, 4.2e+05, inf, nan."""
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.3g}"
    return f"{x:.1e}".replace("e-0", "e-").replace("e+0", "e+")


def pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.01 or x == 0 else f"{100 * x:.1g}%"


def steps(e: SemanticEvent, topo: Topology | None = None) -> str:
    """'from step 0 to 49'; for a state still holding at the end, says how far it was checked."""
    last = topo.last_step if topo is not None else -1
    if e.metrics.get("ongoing") and last >= e.step_end:
        if last == e.step_end:
            return f"from step {e.step_start} to the end of the run (step {last})"
        return f"from step {e.step_start} to the end of the run (last checked at step {e.step_end} of {last})"
    if e.step_start == e.step_end:
        return f"at step {e.step_start}"
    return f"from step {e.step_start} to {e.step_end}"


def _names(layers: Sequence[str], limit: int = 4) -> str:
    quoted = [f"'{n}'" if n else "the model" for n in layers]
    if len(quoted) <= limit:
        return ", ".join(quoted)
    return ", ".join(quoted[:limit]) + f" and {len(quoted) - limit} more"


_EFFECT_WORDS = {
    ("gradient", "vanishing"): "vanishing or zero gradients",
    ("gradient", "exploding"): "exploding gradients",
    ("gradient", "non_finite"): "non-finite gradients",
    ("activation", "dead"): "dead units",
    ("activation", "saturated"): "saturated outputs",
    ("activation", "non_finite"): "non-finite outputs",
    ("activation", "anomalous"): "outputs blowing up",
    ("activation", "amplifying"): "layers amplifying their input",
    ("loss", "non_finite"): "a non-finite loss",
    ("update", "frozen"): "frozen parameters",
    ("update", "stalled"): "stalled updates",
}


def effects(chain: Sequence[SemanticEvent], topo: Topology) -> str:
    """'It caused: vanishing or zero gradients in '0', '1' (from step 0); ...' or '' when nothing."""
    groups: dict[tuple[str, str], list[SemanticEvent]] = {}
    for e in chain:
        groups.setdefault((e.event_type.value, e.to_state), []).append(e)
    parts = []
    for (etype, state), evs in groups.items():
        words = _EFFECT_WORDS.get((etype, state), f"{state} {etype}")
        layers: list[str] = []
        for e in sorted(evs, key=topo.event_position):
            name = e.param or e.layer
            if name not in layers:
                layers.append(name)
        start = min(e.step_start for e in evs)
        where = "in the model" if layers == [""] else f"in {_names(layers)}"
        parts.append(f"{words} {where} (from step {start})")
    return "It caused " + "; ".join(parts) + "." if parts else ""


def explain(
    kind: FailureKind,
    root: SemanticEvent,
    chain: Sequence[SemanticEvent],
    topo: Topology,
    series: Series | None,
) -> tuple[str, str]:
    """(explanation, suggestion) for one hypothesis; the explanation ends with the suggestion."""
    writer = _WRITERS.get(kind, _generic)
    surge = next((e for e in chain[1:] if _is_surge(e)), None)
    rest = [e for e in chain[1:] if e is not surge]
    what, fix = writer(root, rest, topo, series)
    if surge is not None and not _is_surge(root):
        ratio = num(surge.metrics.get("median_update_ratio", math.nan))
        lr = surge.metrics.get("lr")
        with_lr = f", learning rate {num(lr)}" if lr is not None else ""
        what += (
            f" It started right after the updates grew as large as the weights (median ||dW||/||W|| {ratio} "
            f"from step {surge.step_start}{with_lr}): the learning rate is too high."
        )
        if "learning rate" not in fix:
            now = f" (now {num(lr)})" if lr is not None else ""
            fix = f"lower the learning rate{now}, e.g. 10x smaller, or warm it up; then {fix}"
    # events of the root's own kind that the text above already lists are part of the fault, not its effects
    listed = kind in (
        FailureKind.FROZEN_PARAMETERS,
        FailureKind.EXPLODING_GRADIENTS,
        FailureKind.VANISHING_GRADIENTS,
    )
    caused = effects([e for e in rest if not (listed and e.kind is kind)], topo)
    text = " ".join(p for p in (what, caused, f"Fix: {fix}") if p)
    return text, fix


def _is_surge(e: SemanticEvent) -> bool:
    return e.kind is None and e.event_type is EventType.UPDATE and e.to_state == "exploding"


def _series_near(series: Series | None, metric: str, layer: str, step: int) -> float | None:
    if series is None:
        return None
    points = series(metric, layer)
    if not points:
        return None
    return min(points, key=lambda p: abs(p[0] - step))[1]


def _dead(root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None) -> tuple[str, str]:
    m = root.metrics
    units = int(m.get("units", 0))
    frac = m.get("dead_fraction", 0.0)
    functional = m.get("functional") == 1.0
    who = topo.describe(root.layer)
    feeding = root.layer if functional else topo.feeding(root.layer)
    if functional:
        what = (
            f"Dead neurons: {pct(frac)} of the {units} units of {who} have a pre-activation <= 0 on every "
            f"sample and receive exactly zero gradient {steps(root, topo)}."
        )
    else:
        fed = f", fed by {topo.describe(feeding)}" if feeding else ""
        what = (
            f"Dead neurons in {who}{fed}: {pct(frac)} of {units} units inactive on (almost) every sample "
            f"{steps(root, topo)}."
        )
    target = f"'{feeding}'" if feeding else "the layer before it"
    if root.step_start > topo.first_step:
        fix = (
            f"lower the learning rate or clip gradients: the units died at step {root.step_start}, when a large "
            f"update pushed the pre-activations of {target} below zero; a LeakyReLU or GELU cannot die."
        )
    else:
        fix = (
            f"the pre-activations of {target} are negative for every input from the start - check its "
            "initialisation and bias (a large negative bias, or weights scaled wrong); use Kaiming "
            "initialisation, or a LeakyReLU/GELU, which cannot die."
        )
    return what, fix


def _saturated(
    root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None
) -> tuple[str, str]:
    frac = root.metrics.get("saturated_fraction", 0.0)
    feeding = topo.feeding(root.layer)
    what = (
        f"Saturated activations in {topo.describe(root.layer)}: {pct(frac)} of its outputs sit at the bounds, "
        f"where the derivative is below 1% of its maximum, {steps(root, topo)}."
    )
    shrunk = [e for e in rest if e.kind is FailureKind.VANISHING_GRADIENTS]
    if shrunk:
        low = min(shrunk, key=lambda e: e.metrics.get("grad_norm", math.inf))
        what += f" Gradient norm falls to {num(low.metrics.get('grad_norm', 0.0))} at '{low.layer}'."
    target = f"'{feeding}'" if feeding else "the previous layer"
    fix = (
        f"the inputs of the activation are too large - scale down the initialisation of {target} (Xavier/Glorot "
        "for tanh and sigmoid), normalise the inputs, add a normalisation layer before the activation, or use a "
        "non-saturating activation (ReLU, GELU)."
    )
    return what, fix


def _vanishing(
    root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None
) -> tuple[str, str]:
    events = [root, *rest]
    lowest = min(events, key=lambda e: e.metrics.get("grad_norm", math.inf))
    top = root.metrics.get("max_layer_grad_norm", 0.0)
    all_zero = all(e.metrics.get("exact_zero") == 1.0 for e in events)
    layers = sorted({e.layer for e in events}, key=topo.position)
    last = next((n for n in reversed(topo.order) if topo.roles.get(n) == "parametric"), None)
    reference = ""
    if last is not None and last not in layers:
        value = _series_near(series, "grad_norm", last, root.step_start)
        if value is not None:
            reference = f", {num(value)} at '{last}'"
    what = (
        f"Vanishing gradients in {len(layers)} layer{'s' if len(layers) > 1 else ''} back from "
        f"{topo.describe(root.layer)} {steps(root, topo)}: gradient norm "
        f"{num(lowest.metrics.get('grad_norm', 0.0))} at '{lowest.layer}'{reference}"
        f" (largest layer gradient {num(top)})."
    )
    if all_zero:
        fix = (
            "the gradients are exactly zero: the loss does not depend on these parameters - look for a "
            ".detach(), an argmax or comparison, or a ReLU that is dead for every input on the path to the loss."
        )
    else:
        fix = (
            "add residual connections or normalisation layers (BatchNorm, LayerNorm), use a non-saturating "
            "activation (ReLU, GELU) instead of sigmoid/tanh, and use Kaiming (ReLU) or Xavier (tanh) "
            "initialisation."
        )
    return what, fix


def _exploding(
    root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None
) -> tuple[str, str]:
    spread = [e for e in rest if e.kind is FailureKind.EXPLODING_GRADIENTS and e.event_type is EventType.GRADIENT]
    nonfinite = [e for e in rest if e.kind is FailureKind.NON_FINITE]
    layers = sorted({e.layer for e in spread}, key=topo.position)
    worst = max(spread, key=lambda e: e.metrics.get("grad_norm", 0.0), default=None)
    gradients = (
        f" Gradients explode in {_names(layers)} (norm up to {num(worst.metrics.get('grad_norm', math.inf))} at "
        f"'{worst.layer}', from step {min(e.step_start for e in spread)})."
        if worst is not None
        else ""
    )
    lr = _series_near(series, "lr", "", root.step_start)
    if root.event_type is EventType.UPDATE:
        lr_value = root.metrics.get("lr", lr)
        with_lr = f" with learning rate {num(lr_value)}" if lr_value is not None else ""
        what = (
            f"Updates as large as the weights from step {root.step_start}{with_lr}: the median update/weight "
            f"ratio ||dW||/||W|| is {num(root.metrics.get('median_update_ratio', math.nan))} per step "
            "(healthy training moves weights by ~0.1% per step)." + gradients
        )
        fix = _lower_lr(lr_value)
    elif root.kind is None and root.to_state == "amplifying":  # a layer blowing up its input from the start
        what = (
            f"{topo.describe(root.layer)} amplifies its input {num(root.metrics.get('gain', math.inf))}x "
            f"{steps(root, topo)} (output rms {num(root.metrics.get('output_rms', math.inf))}), from the first "
            "step: its weights are too large for its input." + gradients
        )
        fix = (
            f"re-initialise {topo.describe(root.layer)} with a scale that fits its fan-in (Kaiming for ReLU, "
            "Xavier for tanh) or add normalisation after it; clipping gradients would only hide it."
        )
    elif root.kind is None:  # activations blowing up from the first step: the origin's weights are too large
        what = (
            f"Outputs of {topo.describe(root.layer)} blow up {steps(root, topo)} (rms "
            f"{num(root.metrics.get('output_rms', math.inf))}) from the first step: its weights are too large for "
            "its input." + gradients
        )
        fix = (
            f"re-initialise {topo.describe(root.layer)} with a scale that fits its fan-in (Kaiming for ReLU, "
            "Xavier for tanh) or add normalisation after it; clipping gradients would only hide it."
        )
    else:
        what = (
            f"Exploding gradients from step {root.step_start}: gradient norm "
            f"{num(root.metrics.get('grad_norm', math.inf))} at {topo.describe(root.layer)}"
            + (f", and {len(layers)} more layers." if layers else ".")
        )
        ratio = _series_near(series, "update_ratio", root.layer, root.step_start)
        if ratio is not None and math.isfinite(ratio) and ratio > 0.1:
            what += f" Updates reach {num(ratio)}x the weights per step."
        fix = _lower_lr(lr)
        clipped = root.metrics.get("clipped_grad_norm")
        if clipped is not None:
            what += (
                f" Gradient clipping cut the total norm {num(root.metrics.get('clip_factor', math.nan))}x before the "
                f"optimizer step ('{root.layer}' reached it at {num(clipped)}): clipping bounds the steps but hides "
                "the explosion, and the direction it keeps is dominated by the exploding part."
            )
            fix = (
                f"find why the gradients of {topo.describe(root.layer)} are this large: for a recurrent layer, scale "
                "down its recurrent weights (orthogonal initialisation); otherwise lower the learning rate or add "
                "normalisation. Keep clipping as a guard, not a cure."
            )
    if nonfinite:
        what += f" Values turn non-finite at step {min(e.step_start for e in nonfinite)}."
    return what, fix


def _lower_lr(lr: float | None) -> str:
    now = f" (now {num(lr)})" if lr is not None else ""
    return (
        f"lower the learning rate{now}, e.g. 10x smaller; clip gradients with "
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); add normalisation layers; check that inputs and "
        "targets are normalised."
    )


def _non_finite(
    root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None
) -> tuple[str, str]:
    k = root.step_start
    spread = {e.layer for e in rest if e.kind is FailureKind.NON_FINITE and e.layer}
    if root.event_type is EventType.INPUT:
        what = (
            f"The input batch at step {k} contains non-finite values (inf or NaN)"
            + (f"; {len(spread)} layers turned non-finite at once" if spread else "")
            + ". This is a data problem, not a model problem."
        )
        fix = (
            f"check the input batch at step {k} (torch.isfinite(inputs).all()) and the data pipeline that "
            "produced it (division by zero, log of 0, missing values); filter or repair such batches."
        )
    elif root.event_type is EventType.LOSS:
        what = (
            f"The loss became non-finite at step {k} while the model's outputs were finite: the loss computation "
            "produced it."
        )
        fix = (
            "use a numerically stable loss on logits (CrossEntropyLoss, BCEWithLogitsLoss) instead of taking the "
            "log of probabilities, clamp probabilities away from 0 and 1, and check the targets."
        )
    elif root.event_type is EventType.GRADIENT:
        what = (
            f"Non-finite gradients appear first in {topo.describe(root.layer)} at step {k}, in the backward "
            "pass, while the forward pass was finite: an operation there has an infinite derivative."
        )
        fix = (
            "add an epsilon inside sqrt, pow and norm, and to divisors; clamp inputs of log; avoid "
            "differentiating through points where the function is not differentiable."
        )
    else:
        what = (
            f"{topo.describe(root.layer)} produced non-finite values (inf or NaN) at step {k} while its input "
            "was finite" + (f"; they spread to {len(spread)} later layers" if spread else "") + "."
        )
        fix = (
            f"guard the computation in '{root.layer}': clamp before log, sqrt or pow, add an epsilon to "
            "divisions, and check its weights for inf; if values grew before turning non-finite, lower the "
            "learning rate."
        )
    return what, fix


def _frozen(root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None) -> tuple[str, str]:
    events = [root, *[e for e in rest if e.kind is FailureKind.FROZEN_PARAMETERS]]
    params = [e.param or e.layer for e in events]
    layers = sorted({e.layer for e in events}, key=topo.position)
    grad = max(e.metrics.get("grad_norm", 0.0) for e in events)
    missing = root.metrics.get("in_optimizer", 0.0) == 0.0
    reason = "they are not in any optimizer" if missing else "their optimizer group has learning rate 0"
    what = (
        f"Frozen parameters: {_names(params)} (in {_names(layers)}) receive gradients (norm up to {num(grad)}) but "
        f"never change {steps(root, topo)}: {reason}."
    )
    fix = (
        "pass every trainable parameter to the optimizer (e.g. torch.optim.AdamW(model.parameters())) "
        if missing
        else "give that parameter group a non-zero learning rate "
    ) + "- or set requires_grad=False on them if freezing is intended."
    return what, fix


def _stalled(root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None) -> tuple[str, str]:
    median = root.metrics.get("median_update_ratio", 0.0)
    lr = root.metrics.get("lr")
    if median == 0.0:
        what = (
            f"Stalled updates: no parameter changes at all {steps(root, topo)}"
            + (" - the learning rate is 0" if lr == 0.0 else "")
            + "; the loss cannot improve."
        )
        fix = "check the learning-rate scheduler (a schedule sized for epochs but stepped per batch reaches 0 early)."
        return what, fix
    lr_text = f" with learning rate {num(lr)}" if lr is not None else ""
    what = (
        f"Stalled updates{lr_text}: the median update/weight ratio ||dW||/||W|| over the layers is {num(median)} "
        f"per step {steps(root, topo)}; the weights barely move, so the loss cannot improve."
    )
    factor = 1e-3 / median
    fix = (
        f"raise the learning rate (about {num(factor)}x higher reaches the usual ~1e-3 update ratio), and check "
        "the scheduler and warm-up."
    )
    return what, fix


def _generic(root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None) -> tuple[str, str]:
    kind = root.kind.value if root.kind else root.to_state
    metrics = ", ".join(f"{k} {num(v)}" for k, v in root.metrics.items())
    return (
        f"{kind} in {topo.describe(root.layer)} {steps(root, topo)} ({metrics}).",
        "see the detector's documentation.",
    )


_WRITERS = {
    FailureKind.DEAD_NEURONS: _dead,
    FailureKind.SATURATED_ACTIVATIONS: _saturated,
    FailureKind.VANISHING_GRADIENTS: _vanishing,
    FailureKind.EXPLODING_GRADIENTS: _exploding,
    FailureKind.NON_FINITE: _non_finite,
    FailureKind.FROZEN_PARAMETERS: _frozen,
    FailureKind.STALLED_UPDATES: _stalled,
}
