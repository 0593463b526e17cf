"""The terminal report: a verdict line, then one numbered paragraph per hypothesis."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

from ..kinds import registry
from ..reasoning.hypothesis import CausalHypothesis
from ..text import num
from .inert import inert


def verdict(hypotheses: Sequence[CausalHypothesis], meta: dict[str, Any]) -> str:
    steps = meta.get("steps_observed", 0)
    model = inert(str(meta.get("model", "model")))
    if not hypotheses:
        return f"NeuralDBG: healthy - no training failure in {steps} observed steps of {model}.{_loss_caveat(meta)}"
    kinds = inert(", ".join(dict.fromkeys(h.kind.value for h in hypotheses)))
    if all(registry.room(h.kind).inconclusive for h in hypotheses):  # about what was observed, not the training
        return (
            f"NeuralDBG: INCONCLUSIVE - {kinds} in {steps} observed steps of {model}: the run was not fully "
            "observed, so it cannot be called healthy."
        )
    n = len(hypotheses)
    return (
        f"NeuralDBG: UNHEALTHY - {n} failure hypothes{'es' if n > 1 else 'is'} ({kinds}) in {steps} steps of {model}."
    )


def _loss_caveat(meta: dict[str, Any]) -> str:
    """What a healthy verdict did not cover: a loss too short to judge (a smoke run checks the gradients, the
    activations and the updates, not yet whether the model learns). Empty where the loss was judged, and for traces
    written before the count was kept."""
    moved = meta.get("loss_unjudged_moved")
    if isinstance(moved, (int, float)) and not isinstance(moved, bool) and math.isfinite(moved) and moved >= 0:
        return (
            f" Its loss was not judged: it stayed where it began, or at a guess, while the updates added up to "
            f"{num(moved)} of the weights' norm over the run, too little to tell a loss that cannot fall from one "
            "that has not started to."
        )
    losses = meta.get("losses_recorded")
    needed = meta.get("config", {}).get("loss_min_steps")
    if not isinstance(losses, int) or not isinstance(needed, int) or losses >= needed:
        return ""
    if losses == 0:
        return " Its loss was not seen, so whether it fell was not judged."
    return (
        f" Its loss was not judged: {losses} loss{'es' if losses != 1 else ''} recorded, {needed} needed to tell one "
        "that does not fall from one that has not started to."
    )


def report(hypotheses: Sequence[CausalHypothesis], meta: dict[str, Any], width: int = 100) -> str:
    """The verdict and each hypothesis, for a terminal: names from the model are inert (control and bidirectional
    characters as visible escapes, see :mod:`neuraldbg.export.inert`), so no name can erase or fake a line."""
    lines = [verdict(hypotheses, meta)]
    for i, h in enumerate(hypotheses, start=1):
        lines.append("")
        lines.append(f"{i}. {inert(h.summary())}")
        lines.extend(textwrap.wrap(inert(h.explanation), width=width, initial_indent="   ", subsequent_indent="   "))
    return "\n".join(lines)
