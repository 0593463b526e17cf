"""Numbers and events in plain words, for people: what ``str(event)`` and the explanations print.

No state names joined by arrows ("activation normal -> non_finite at '3'"): an event reads as its place, what
held there with the number that shows it, and the steps it held over ("'3': outputs non-finite (inf or NaN),
steps 7-20").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..events import EventType, FailureKind

if TYPE_CHECKING:
    from ..events import SemanticEvent


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


def count(x: float) -> str:
    return str(int(x)) if math.isfinite(x) else num(x)


def state(e: SemanticEvent) -> str:
    """What held, with the number that shows it: "100% of 64 units dead", "gradient exactly zero"."""
    m = e.metrics
    t, s = e.event_type, e.to_state
    if t is EventType.RUN:
        return _run_state(e)
    if s == "non_finite":
        return {
            EventType.INPUT: "non-finite values (inf or NaN) in the batch",
            EventType.LOSS: "non-finite loss (inf or NaN)",
            EventType.GRADIENT: "gradient non-finite (inf or NaN)",
        }.get(t, "outputs non-finite (inf or NaN)")
    if t is EventType.GRADIENT:
        if s == "vanishing":
            if m.get("exact_zero") == 1.0:
                return "gradient exactly zero"
            return f"gradient vanishing (norm {num(m.get('grad_norm', 0.0))})"
        if s == "exploding":
            clipped = m.get("clipped_grad_norm")
            tail = f", clipped to {num(clipped)}" if clipped is not None else ""
            return f"gradient exploding (norm {num(m.get('grad_norm', math.inf))}{tail})"
    if t is EventType.ACTIVATION:
        if s == "dead":
            units = m.get("units")
            of = f" of {count(units)} units" if units else " of its units"
            return f"{pct(m.get('dead_fraction', 0.0))}{of} dead (never positive)"
        if s == "saturated":
            return f"{pct(m.get('saturated_fraction', 0.0))} of outputs saturated"
        if s == "anomalous":
            return f"outputs blowing up (rms {num(m.get('output_rms', math.inf))})"
        if s == "amplifying":
            return f"amplifies its input {num(m.get('gain', math.inf))}x"
    if t is EventType.UPDATE:
        if s == "frozen":
            why = "not in any optimizer" if m.get("in_optimizer", 0.0) == 0.0 else "learning rate 0"
            return f"never updated although it gets gradients ({why})"
        # model-wide update states read after their place, "the model's updates"
        updates = "" if not e.layer and e.param is None else "updates "
        if s == "stalled":
            ratio = m.get("median_update_ratio", 0.0)
            if ratio == 0.0:
                return "no parameter moves at all"
            return f"{updates}stalled (median update/weight ratio {num(ratio)})"
        if s == "exploding":
            lr = m.get("lr")
            with_lr = f", learning rate {num(lr)}" if lr is not None else ""
            surge = num(m.get("median_update_ratio", math.nan))
            return f"{updates}as large as the weights (median update/weight ratio {surge}{with_lr})"
    words = s.replace("_", " ")
    if e.kind is None or e.kind.value == s:
        return words
    return f"{e.kind.value.replace('_', ' ')} ({words})"


def _run_state(e: SemanticEvent) -> str:
    m, k = e.metrics, e.kind
    if k is FailureKind.NO_TRAINING_OBSERVED:
        return f"no training step observed ({count(m.get('forwards', 0.0))} forward passes seen)"
    if k is FailureKind.NO_GRADIENT:
        return (
            f"no gradient reached the {count(m.get('trainable_parameters', 0.0))} trainable parameters "
            f"({count(m.get('steps', 0.0))} optimizer steps, {count(m.get('backward_passes', 0.0))} backward passes)"
        )
    if k is FailureKind.EVAL_MODE_TRAINING:
        layers = f": {e.detail}" if e.detail else ""
        return f"trained in eval mode ({count(m.get('steps', 0.0))} steps{layers})"
    if k is FailureKind.DEGENERATE_LOSS:
        loss = m.get("loss")
        value = f", loss {num(loss)}" if loss is not None else ""
        return f"exactly zero gradient with respect to the model's output at every step{value}"
    if k is FailureKind.INCOMPLETE_OBSERVATION:
        return "observation stopped" + (f": {e.detail}" if e.detail else "")
    return k.value.replace("_", " ") if k is not None else e.to_state.replace("_", " ")


def steps_of(e: SemanticEvent) -> str:
    """ "step 3" or "steps 0-32", and "(still so at the last check)" for a state that held to the end."""
    span = f"step {e.step_start}" if e.step_start == e.step_end else f"steps {e.step_start}-{e.step_end}"
    return span + (", still so at the last check" if e.metrics.get("ongoing") else "")


def event_text(e: SemanticEvent) -> str:
    """``'fc2.weight': never updated although it gets gradients (not in any optimizer), steps 0-32``."""
    text = f"{e.where}: {state(e)}, {steps_of(e)}"
    before = e.from_state
    if before is not None and before not in ("normal", "healthy") and before != e.to_state:
        text += f" (previously {before.replace('_', '-')})"
    return text
