"""An unstable loss: it climbs over the run; a classifier's loss ends above log(classes), where it began (training
made it worse than a guess); or it stopped falling while each update changes the weights by a large fraction of
their norm (``loss_large_update``, or weights whose norm grew 2.5-fold) and the fit has not converged: the learning
rate is too high for the loss to settle, though not high enough for the gradients to explode.

A climb is judged against the loss's own noise (its end above its start by more than its batch-to-batch spread and
two standard errors); a stop is a second half that fell, with that confidence, by less than that spread, by factors
(on the log scale) when the loss stays positive: a heavy-tailed loss that still halves is not stopped. See
:mod:`.loss_evidence` for the runs it is judged on. A fault that began first (gradients not zeroed, an explosion)
explains it.

The steps must be too large where the loss stopped (:func:`large_steps`). When a schedule cut the learning rate to
``CUT`` of where it began before the second half, they are read over the second half only: a loss that stops
falling after the schedule cut the learning rate a hundredfold settled, it was not kept from settling (a
factorisation under StepLR x0.1 at a third and two thirds of the run, whose weights grew 4-fold in its first third).
And weights whose norm grew are evidence only when steps that size, pointing at random, could have grown them
(:func:`random_walk`, ``WALK``): steps too large random-walk the weights outwards, while embedding tables without
weight decay are pulled outwards by their gradient, 7-fold at updates of 1e-3 of the weights per step, with a loss
still falling epoch after epoch (at batch 8 the loss moves more from batch to batch than over the second half, so
the test of a stop alone cannot tell).
"""

from __future__ import annotations

import math

from ..capture.coverage import Coverage, RunFacts
from ..config import DebugConfig
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..stats.training import TrainingFacts
from ..text import count, num
from . import loss_evidence
from .base import Series, run_event

KIND = FailureKind.UNSTABLE_LOSS

#: The shapes of an unstable loss (its ``shape`` metric).
CLIMBING, ABOVE_CHANCE, STOPPED = 1.0, 2.0, 3.0
#: A learning rate over the second half at most this share of the one of the first quarter was cut by a schedule.
CUT = 0.1
#: Updates pointing at random would grow the weights' norm by at least this share of its growth (on the log scale)
#: when steps too large grew it (calibrated: a ConvNeXt at a learning rate 100x too high, the one run of the
#: real-programs benchmark whose weights grew 2.5-fold while its loss stopped, 0.6; embedding tables of a matrix
#: factorisation without weight decay, whose gradient pulls them outwards at ||dW||/||W|| of 1e-3 per step, 0.018).
WALK = 0.1


#: A loss that stopped after falling this many times over is settled at a floor the steps allowed, not held up by
#: them (LoRA adapters starting at zero: their first updates are large against their tiny weights, and the loss
#: fell 23-fold to a fit of 0.98 accuracy before it flattened).
SETTLED = 10.0


def _began(coverage: Coverage, curve: loss_evidence.Curve) -> float:
    """Where a loss that held its level over the second half began: the larger of the mean of the curve's start (its
    first eighth) and the mean of the run's first losses (:func:`.loss_evidence.first_losses_mean`). A loss that
    falls fast has fallen most of the way within the first eighth of a long run (an autoencoder under Adam at 0.03:
    0.39 -> 0.08 in its first 37 steps, then 0.008), so the eighth alone would understate its fall. A loss that
    rose over its second half is judged from the eighth only: it did not settle where it stopped (a heavy-tailed
    loss whose first losses are its largest)."""
    first = loss_evidence.first_losses_mean(coverage)
    held = curve.second_half[1] <= curve.second_half[0]
    return max(curve.start.mean, first) if first is not None and held else curve.start.mean


def large_steps(coverage: Coverage, config: DebugConfig) -> str:
    """The evidence of steps too large for the loss to settle where it stopped, in words, or "": updates of at least
    ``loss_large_update`` of the weights' norm over the first quarter of the run, or weights whose norm grew
    2.5-fold by steps that size could random-walk them; both over the second half when a schedule cut the learning
    rate to ``CUT`` of where it began (see the module docstring)."""
    facts = coverage.training
    lr0, lr1 = facts.median("lr", 0.0, 0.25), facts.median("lr", 0.5, 1.0)
    start = 0.5 if math.isfinite(lr0) and math.isfinite(lr1) and lr1 <= CUT * lr0 else 0.0
    ratio = facts.median("update_ratio", start, start + 0.25)
    where = "over the second half of the run" if start else "over the first quarter of the run"
    if math.isfinite(ratio) and ratio >= config.loss_large_update:
        return f"each update changed the weights by {num(ratio)} of their norm {where}"
    w0, w1 = facts.median("weight_norm", start, start + 0.1), facts.median("weight_norm", 0.9, 1.0)
    if not (math.isfinite(w0) and math.isfinite(w1) and w0 > 0 and w1 >= loss_evidence.WEIGHT_GROWTH * w0):
        return ""
    # the walk over the stretch the growth is measured over: from the middle of the window of its first norm (the
    # first steps of weights initialised small move them by more than their size, which is not where they grew)
    walk = random_walk(facts, coverage.stepped_steps or coverage.steps, start + 0.05)
    if walk < WALK * math.log(w1 / w0):
        return ""
    span = "the second half of the run" if start else "the run"
    return f"the weights' norm grew {num(w1 / w0)}-fold over {span} ({num(w0)} to {num(w1)})"


def random_walk(facts: TrainingFacts, steps: int, start: float) -> float:
    """The log of the growth of the weights' norm that the run's updates from ``start`` (a fraction of its rows)
    would make if each pointed at random (||W + dW||^2 = ||W||^2 (1 + r^2) for an update dW orthogonal to W, r its
    update/weight ratio): half the sum of the squared ratios over the steps, each row standing for the steps until
    the next."""
    rows = facts.rows
    if not rows:
        return 0.0
    end = rows[0].step + steps  # the step after the run's last
    total = 0.0
    for i in range(facts.between(start, 1.0)[0], len(rows)):  # the rows facts.median reads
        span = (rows[i + 1].step if i + 1 < len(rows) else end) - rows[i].step  # the steps this row stands for
        if math.isfinite(rows[i].update_ratio):
            total += rows[i].update_ratio ** 2 * max(span, 1)
    return total / 2


class UnstableLoss(loss_evidence.LossKind):
    name = KIND.value
    title = "unstable loss"
    loss_order = 2
    lr_sensitive = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        found = loss_evidence.finding(coverage, facts.config)
        if found is None or found[0] != self.name:
            return None
        curve = found[1]
        detail = curve.large_updates
        if curve.verdict != "climbing" and not curve.above_chance:  # stopped: large steps where it stopped
            if curve.end.mean > 0 and _began(coverage, curve) >= SETTLED * curve.end.mean:
                return None  # it fell tenfold before it stopped: the steps let it settle (a fit's floor)
            detail = large_steps(coverage, facts.config)
            if not detail:
                return None
        metrics = loss_evidence.evidence(coverage, facts.config, curve)
        metrics["shape"] = CLIMBING if curve.verdict == "climbing" else ABOVE_CHANCE if curve.above_chance else STOPPED
        return run_event(KIND, curve.start.first, curve.end.last, detail, **metrics)

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        start, end, noise = m.get("start", 0.0), m.get("end", 0.0), m.get("noise", 0.0)
        steps = count(m.get("losses", 0.0))
        shape = m.get("shape", STOPPED)
        if shape == CLIMBING:
            what = (
                f"The loss climbed: over {steps} steps it went from {num(start)} (its first steps) to {num(end)} "
                f"(steps {int(m.get('end_from', root.step_end))}-{root.step_end}), up by more than its batch-to-batch "
                f"spread ({num(noise)}), while the gradients stayed finite."
            )
        elif shape == ABOVE_CHANCE:
            classes = int(m.get("classes", 0.0))
            what = (
                f"The loss ended above chance: it began at {num(m.get('first_loss', start))}, the loss of an untrained "
                f"classifier (log({max(classes, 2)}) = {num(m.get('chance', 0.0))}), and over steps "
                f"{int(m.get('end_from', root.step_end))}-{root.step_end} averaged {num(end)}: training made the "
                "predictions worse than a guess, with finite gradients."
            )
        else:
            if m.get("by_factors") and "half_noise" in m:  # judged by factors: the spread is one too
                spread = f"not down by the factor it moves by from batch to batch ({num(m['half_noise'])}x)"
            else:
                spread = f"less than its batch-to-batch spread ({num(noise)})"
            what = (
                f"The loss stopped falling at {num(end)}: over the second half of the run it went from "
                f"{num(m.get('half_from', end))} to {num(m.get('half_to', end))}, {spread}, while "
                f"{root.detail or 'the updates were large'}: the steps are too large for the loss to settle into a "
                "minimum."
            )
        causes, fix = loss_evidence.ranked(m, "unstable")
        return what + causes, fix

    def describe(self, event: SemanticEvent) -> str:
        m = event.metrics
        shape = m.get("shape", STOPPED)
        how = "climbing" if shape == CLIMBING else "above chance" if shape == ABOVE_CHANCE else "stopped falling"
        return f"unstable loss ({how}: {num(m.get('start', 0.0))} to {num(m.get('end', 0.0))})"

    def label(self, event: SemanticEvent) -> str:
        return f"unstable loss: {num(event.metrics.get('end', 0.0))}"

    def effect(self, event: SemanticEvent) -> str:
        return "an unstable loss"
