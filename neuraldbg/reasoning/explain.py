"""Explanations in words: what failed, where, over which steps, the numbers, what it caused, what to change.

The fixes follow what users act on (DeepDiagnosis' decision tree): weights off -> change the initialisation;
update/weight ratio off -> change the learning rate; data non-finite -> check the input batch at that step;
otherwise a symptom-specific default (normalisation, residual connections, clipping, another activation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..events import EventType, FailureKind, SemanticEvent
from .hypothesis import Coupling
from .rules import SETS_OFF, is_update_surge
from .topology import Topology
from .words import count, num, pct

__all__ = ["effects", "explain", "num", "pct", "steps"]

Series = Callable[[str, str], list[tuple[int, float]]]


def steps(e: SemanticEvent, topo: Topology | None = None) -> str:
    """'from step 0 to 49'; for a state still holding at the end, how far it was measured."""
    last = topo.last_step if topo is not None else -1
    if e.metrics.get("ongoing") and last >= e.step_end:
        if last == e.step_end:
            return f"from step {e.step_start} to the end of the run (step {last})"
        # cheap steps do not measure every state: say what was seen, and that nothing after it said otherwise
        return f"from step {e.step_start} until the run ended at step {last} (measured up to step {e.step_end})"
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
    ("update", "exploding"): "updates as large as the weights",
}


def effects(chain: Sequence[SemanticEvent], topo: Topology) -> str:
    """'It caused: vanishing or zero gradients in '0', '1' (from step 0); ...' or '' when nothing."""
    groups: dict[tuple[str, str], list[SemanticEvent]] = {}
    for e in chain:
        groups.setdefault((e.event_type.value, e.to_state), []).append(e)
    parts = []
    for (etype, state), evs in groups.items():
        words = _EFFECT_WORDS.get((etype, state), f"{state} {etype}")
        layers = list(dict.fromkeys(e.param or e.layer for e in sorted(evs, key=topo.event_position)))
        start = min(e.step_start for e in evs)
        where = "in the model" if layers == [""] else f"in {_names(layers)}"
        parts.append(f"{words} {where} (from step {start})")
    return "It caused " + "; ".join(parts) + "." if parts else ""


def explain(
    kind: FailureKind,
    root: SemanticEvent,
    chain: Sequence[SemanticEvent],
    couplings: Sequence[Coupling],
    topo: Topology,
    series: Series | None,
) -> tuple[str, str]:
    """(explanation, suggestion) for one hypothesis; the explanation ends with the suggestion.

    Update surges in the chain are the learning rate's evidence when they set the root off or recur at its
    learning rate (no coupling), and effects of an explosion otherwise (coupled to it).
    """
    writer = _WRITERS.get(kind, _generic)
    caused = {id(c.effect) for c in couplings if c.relation != SETS_OFF}
    trigger = next((c.cause for c in couplings if c.relation == SETS_OFF and c.effect is root), None)
    recurring = [e for e in chain[1:] if is_update_surge(e) and e is not trigger and id(e) not in caused]
    evidence = {id(e) for e in recurring} | ({id(trigger)} if trigger is not None else set())
    rest = [e for e in chain[1:] if id(e) not in evidence]
    what, fix = writer(root, rest, topo, series)
    lr_named = False
    if trigger is not None:
        lr_named = True
        what += (
            f" It started right after the updates grew as large as the weights (median ||dW||/||W|| "
            f"{num(trigger.metrics.get('median_update_ratio', math.nan))} from step {trigger.step_start}"
            f"{_with_lr(trigger)}): the learning rate is too high."
        )
    if recurring:
        lr_named = True
        again = min(e.step_start for e in recurring)
        if is_update_surge(root) or trigger is not None:
            what += f" The updates are as large as the weights again from step {again}."
        else:
            what += (
                f" From step {again} the updates are as large as the weights at the learning rate in force when "
                f"it began (median ||dW||/||W|| {num(recurring[0].metrics.get('median_update_ratio', math.nan))}"
                f"{_with_lr(recurring[0])}): the learning rate is too high."
            )
    if lr_named and not is_update_surge(root) and "learning rate" not in fix:
        lr = (trigger or recurring[0]).metrics.get("lr")
        now = f" (now {num(lr)})" if lr is not None else ""
        fix = f"lower the learning rate{now}, e.g. 10x smaller, or warm it up; then {fix}"
    # events of the root's own kind that the text above already lists are part of the fault, not its effects
    listed = kind in (
        FailureKind.FROZEN_PARAMETERS,
        FailureKind.EXPLODING_GRADIENTS,
        FailureKind.VANISHING_GRADIENTS,
    )
    consequences = effects([e for e in rest if not (listed and e.kind is kind)], topo)
    text = " ".join(p for p in (what, consequences, f"Fix: {fix}") if p)
    return text, fix


def _with_lr(surge: SemanticEvent) -> str:
    lr = surge.metrics.get("lr")
    return f", learning rate {num(lr)}" if lr is not None else ""


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
        lr = _series_near(series, "lr", "", root.step_start)
        now = f" (now {num(lr)})" if lr is not None else ""
        fix = (
            f"lower the learning rate{now} or clip gradients: the units died at step {root.step_start}, when a "
            f"large update pushed the pre-activations of {target} below zero; a LeakyReLU or GELU cannot die."
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
    last = topo.last_parametric()
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
    if missing and root.metrics.get("none_stepped") == 1.0:
        reason = (
            "they are not in any optimizer, and no optimizer steps any parameter of the model (an optimizer built "
            "over other parameters, such as a frozen backbone's, or an optimizer.step() that is never called)"
        )
    else:
        reason = "they are not in any optimizer" if missing else "their optimizer group has learning rate 0"
    zero = [e for e in events if e.metrics.get("zero_weight") == 1.0]
    blocked = ""
    if zero:
        blocking = sorted({e.layer for e in zero}, key=topo.position)
        blocked = (
            f" {_names([e.param or e.layer for e in zero])} {'is' if len(zero) == 1 else 'are'} all zeros and, "
            f"frozen, stay{'s' if len(zero) == 1 else ''} so: no gradient passes back through {_names(blocking)} "
            "to the layers before."
        )
    what = (
        f"Frozen parameters: {_names(params)} (in {_names(layers)}) receive gradients (norm up to {num(grad)}) but "
        f"never change {steps(root, topo)}: {reason}.{blocked}"
    )
    if not missing:
        fix = "give that parameter group a non-zero learning rate "
    elif root.metrics.get("none_stepped") == 1.0:
        fix = (
            "build the optimizer over the parameters that train (e.g. torch.optim.AdamW(p for p in "
            "model.parameters() if p.requires_grad)) and call optimizer.step() after backward() "
        )
    else:
        fix = "pass every trainable parameter to the optimizer (e.g. torch.optim.AdamW(model.parameters())) "
    fix += "- or set requires_grad=False on them if freezing is intended."
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


# --- run-level findings: what was (not) observed of the run as a whole --------------------------------------


def _no_training(
    root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None
) -> tuple[str, str]:
    m = root.metrics
    forwards = int(m.get("forwards", 0.0))
    no_grad, evals, threads = (
        int(m.get(k, 0.0)) for k in ("no_grad_forwards", "eval_forwards", "other_thread_forwards")
    )
    if forwards == 0:
        what = (
            "No training step was observed: the model was never called while NeuralDBG watched it, so nothing "
            "about its training can be concluded."
        )
        fix = (
            "check that the training loop runs inside the `with NeuralDbg(model)` block, that its data loader is "
            "not empty (len(loader) > 0), and that it trains this model object - not a copy, or a model built "
            "after NeuralDBG was attached."
        )
        return what, fix
    parts = [
        f"{count(no_grad)} under torch.no_grad()" if no_grad else "",
        f"{count(evals)} in eval mode with no backward pass" if evals else "",
        f"{count(threads)} in another thread" if threads else "",
    ]
    how = "; ".join(p for p in parts if p)
    what = (
        f"No training step was observed: the model ran {count(forwards)} forward passes while watched"
        + (f" ({how})" if how else "")
        + ", but no backward pass and optimizer step followed any of them. Nothing about its training can be "
        "concluded."
    )
    if no_grad + evals >= forwards:
        fix = (
            "only validation or inference ran under the debugger: put the training loop (model.train(), the "
            "forward pass with gradients, loss.backward(), optimizer.step()) inside the `with NeuralDbg(model)` "
            "block."
        )
    elif threads:
        fix = (
            "the forward passes ran in a thread other than the one that attached NeuralDBG: attach it in the "
            "thread that trains (or call dbg.step() there after each optimizer step)."
        )
    else:
        fix = (
            "call loss.backward() and optimizer.step() on this model's loss inside the `with NeuralDbg(model)` "
            "block, and check that the optimizer holds this model's parameters."
        )
    return what, fix


def _no_gradient(
    root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None
) -> tuple[str, str]:
    m = root.metrics
    backward = int(m.get("backward_passes", 0.0))
    params, taken = count(m.get("trainable_parameters", 0.0)), count(m.get("steps", 0.0))
    if backward == 0:
        what = (
            f"No gradient: the optimizer stepped {taken} times, but no backward pass ever reached the model, so "
            f"none of the {params} trainable parameters received a gradient: loss.backward() was never called, "
            "or the loss it was called on does not depend on the model's output (a .detach(), .item() or "
            "torch.tensor(...) between them). The model cannot learn."
        )
        fix = (
            "call loss.backward() after computing the loss and before optimizer.step(), every step, on a loss "
            "computed from the model's output tensor itself."
        )
    else:
        what = (
            f"No gradient: {count(backward)} backward passes ran during {taken} optimizer steps, but no gradient "
            f"reached any of the {params} trainable parameters: the loss is detached from the model's graph "
            "(a .detach(), .item() or .numpy() on the way from the output to the loss, a forward pass under "
            "torch.no_grad(), or a loss rebuilt with torch.tensor(...)). The model cannot learn."
        )
        fix = (
            "compute the loss from the model's output tensor itself, with gradients enabled: remove .detach(), "
            ".item() and torch.tensor(...) between model(x) and the loss, and any torch.no_grad() around the "
            "training forward pass; loss.requires_grad must be True before loss.backward()."
        )
    return what, fix


def _eval_mode(
    root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None
) -> tuple[str, str]:
    m = root.metrics
    taken = count(m.get("steps", 0.0))
    layers = int(m.get("mode_dependent_layers", 0.0))
    which = f" ({root.detail})" if root.detail else ""
    what = (
        f"The model trained in eval mode: {taken} training steps {steps(root, topo)} ran their forward pass "
        f"with model.training False, so its {layers} layer{'s' if layers != 1 else ''} whose behaviour depends on "
        f"the mode{which} behaved as at inference: dropout was off and batch-norm statistics were frozen while "
        "the optimizer stepped."
    )
    fix = "call model.train() before the training loop, and again after every validation pass that calls model.eval()."
    return what, fix


def _degenerate_loss(
    root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None
) -> tuple[str, str]:
    m = root.metrics
    loss = m.get("loss")
    value = f" (loss {num(loss)})" if loss is not None else ""
    what = (
        f"Degenerate loss: at all {count(m.get('steps', 0.0))} observed steps{value} the gradient of the loss with "
        "respect to the model's output is exactly zero, so no parameter can learn, whatever the layers do. "
        "Typical causes: cross_entropy on a model with a single output unit (the log-softmax of one logit is "
        "always 0), a loss multiplied by 0, or a loss that does not depend on the output."
    )
    fix = (
        "check the loss: for two classes with one output unit use "
        "binary_cross_entropy_with_logits (BCEWithLogitsLoss) with float targets, or give the model one output "
        "per class for cross_entropy; remove any factor that makes the loss constant."
    )
    return what, fix


def _incomplete(
    root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None
) -> tuple[str, str]:
    m = root.metrics
    k = int(m.get("step", root.step_start))
    skipped = int(m.get("skipped_parameters", 0.0))
    detail = f": {root.detail}" if root.detail else ""
    what = f"Observation incomplete from step {k}{detail}."
    if skipped:
        what += f" {count(skipped)} parameters were not measured."
    what += (
        " Findings from before that stand; what came after was not checked, so this run cannot be called "
        "healthy. The training itself was not affected."
    )
    fix = (
        "treat this run's diagnosis as partial; if the detail above points at NeuralDBG rather than the model, "
        "report it with the detail."
    )
    return what, fix


def _loss_scale_collapse(
    root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series | None
) -> tuple[str, str]:
    m = root.metrics
    skipped, steps = m.get("skipped_steps", 0.0), m.get("steps", 0.0)
    scales = ""
    if "first_scale" in m and "loss_scale" in m:
        scales = f"; its scale went from {num(m['first_scale'])} to {num(m['loss_scale'])}"
    what = (
        f"Loss-scale collapse: the GradScaler skipped {count(skipped)} of {count(steps)} observed steps "
        f"({root.detail or 'most of the last steps skipped'}){scales}. A skipped step leaves the weights "
        "unchanged: the scaled gradients overflowed float16 (or were NaN), so this run hardly trains."
    )
    if m.get("min_scale", math.inf) < 1:
        fix = (
            "the scale fell below 1, so the gradients overflow (or are NaN) even unscaled: find the layer with "
            "torch.autograd.detect_anomaly() on one batch, lower the learning rate, or train in bfloat16 (which "
            "needs no GradScaler)."
        )
    else:
        fix = (
            "start from a smaller init_scale (the default is 2**16) or give the scaler more steps to find its "
            "scale; if it keeps skipping, some gradient is inf or NaN at any scale: find it with "
            "torch.autograd.detect_anomaly() on one batch, or train in bfloat16."
        )
    return what, fix


_WRITERS = {
    FailureKind.DEAD_NEURONS: _dead,
    FailureKind.SATURATED_ACTIVATIONS: _saturated,
    FailureKind.VANISHING_GRADIENTS: _vanishing,
    FailureKind.EXPLODING_GRADIENTS: _exploding,
    FailureKind.NON_FINITE: _non_finite,
    FailureKind.FROZEN_PARAMETERS: _frozen,
    FailureKind.STALLED_UPDATES: _stalled,
    FailureKind.NO_TRAINING_OBSERVED: _no_training,
    FailureKind.NO_GRADIENT: _no_gradient,
    FailureKind.EVAL_MODE_TRAINING: _eval_mode,
    FailureKind.DEGENERATE_LOSS: _degenerate_loss,
    FailureKind.INCOMPLETE_OBSERVATION: _incomplete,
    FailureKind.LOSS_SCALE_COLLAPSE: _loss_scale_collapse,
}
