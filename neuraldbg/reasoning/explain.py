"""Explanations in words: what failed, where, over which steps, the numbers, what it caused, what to change.

Each kind's room writes what happened and the fix (:meth:`~neuraldbg.kinds.Kind.explain`); this module puts a
hypothesis' explanation together: the room's words, the learning rate when updates as large as the weights set the
fault off or recur at its rate, what the fault caused, and the fix. The fixes follow what users act on
(DeepDiagnosis' decision tree): weights off -> change the initialisation; update/weight ratio off -> change the
learning rate; data non-finite -> check the input batch at that step; otherwise a symptom-specific default
(normalisation, residual connections, clipping, another activation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..events import EventType, FailureKind, SemanticEvent
from ..kinds import registry
from ..text import num, quoted
from .hypothesis import Coupling
from .rules import SETS_OFF, is_update_surge
from .topology import Topology

Series = Callable[[str, str], list[tuple[int, float]]]


def effects(chain: Sequence[SemanticEvent], topo: Topology) -> str:
    """'It caused: vanishing or zero gradients in '0', '1' (from step 0); ...' or '' when nothing."""
    groups: dict[tuple[str, str], list[SemanticEvent]] = {}
    for e in chain:
        groups.setdefault((e.event_type.value, str(e.to_state)), []).append(e)
    parts = []
    for evs in groups.values():
        words = registry.effect(evs[0])
        layers = list(dict.fromkeys(e.param or e.layer for e in sorted(evs, key=topo.event_position)))
        start = min(e.step_start for e in evs)
        where = "in the model" if layers == [""] else f"in {quoted(layers)}"
        # a loss finding judges the run's curve as a whole: its first step is the run's, not when the loss went wrong
        over_the_run = all(
            e.event_type is EventType.RUN and e.kind is not None and registry.room(e.kind).loss_symptom for e in evs
        )
        parts.append(f"{words} {where} ({'over the run' if over_the_run else f'from step {start}'})")
    parts = list(dict.fromkeys(parts))  # two events of one kind in the same place and step read the same
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
    room = registry.room(kind)
    caused = {id(c.effect) for c in couplings if c.relation != SETS_OFF}
    trigger = next((c.cause for c in couplings if c.relation == SETS_OFF and c.effect is root), None)
    recurring = [e for e in chain[1:] if is_update_surge(e) and e is not trigger and id(e) not in caused]
    evidence = {id(e) for e in recurring} | ({id(trigger)} if trigger is not None else set())
    rest = [e for e in chain[1:] if id(e) not in evidence]
    what, fix = registry.explain(room, root, rest, topo, series or _no_series)
    lr_named = False
    if trigger is not None:
        lr_named = True
        what += (
            f" It started right after oversized updates (median ||dW||/||W|| "
            f"{num(trigger.metrics.get('median_update_ratio', math.nan))} per step from step {trigger.step_start}"
            f"{_with_lr(trigger)}): the learning rate is too high."
        )
    if recurring:
        lr_named = True
        again = min(e.step_start for e in recurring)
        if is_update_surge(root) or trigger is not None:
            what += f" Oversized updates again from step {again}."
        else:
            what += (
                f" From step {again} the updates are oversized at the learning rate in force when "
                f"it began (median ||dW||/||W|| {num(recurring[0].metrics.get('median_update_ratio', math.nan))}"
                f"{_with_lr(recurring[0])}): the learning rate is too high."
            )
    if lr_named and not is_update_surge(root) and "learning rate" not in fix:
        lr = (trigger or recurring[0]).metrics.get("lr")
        now = f" (now {num(lr)})" if lr is not None else ""
        fix = f"lower the learning rate{now}, e.g. 10x smaller, or warm it up; then {fix}"
    # events of the root's own kind that the text above already lists are part of the fault, not its effects
    # the root's own kind in its own layer (a shared layer's second call) is the root again, not its effect
    consequences = effects(
        [e for e in rest if not (e.kind is kind and (room.lists_own or e.layer == root.layer))], topo
    )
    text = " ".join(p for p in (what, consequences, f"Fix: {fix}") if p)
    return text, fix


def _with_lr(surge: SemanticEvent) -> str:
    lr = surge.metrics.get("lr")
    return f", learning rate {num(lr)}" if lr is not None else ""


def _no_series(metric: str, layer: str) -> list[tuple[int, float]]:
    return []
