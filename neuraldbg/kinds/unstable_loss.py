"""An unstable loss: it climbs over the run; a classifier's loss ends above log(classes), where it began (training
made it worse than a guess); or it stopped falling while each update changes the weights by a large fraction of
their norm (``loss_large_update``, or weights whose norm grew 2.5-fold) and the fit has not converged: the learning
rate is too high for the loss to settle, though not high enough for the gradients to explode.

A climb is judged against the loss's own noise (its end above its start by more than its batch-to-batch spread and
two standard errors); a stop is a second half that fell, with that confidence, by less than that spread, by factors
(on the log scale) when the loss stays positive: a heavy-tailed loss that still halves is not stopped. See
:mod:`.loss_evidence` for the runs it is judged on. A fault that began first (gradients not zeroed, an explosion)
explains it.
"""

from __future__ import annotations

from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, num
from . import loss_evidence
from .base import Series, run_event

KIND = FailureKind.UNSTABLE_LOSS

#: The shapes of an unstable loss (its ``shape`` metric).
CLIMBING, ABOVE_CHANCE, STOPPED = 1.0, 2.0, 3.0


class UnstableLoss(loss_evidence.LossKind):
    name = KIND.value
    title = "unstable loss"
    loss_order = 2
    lr_sensitive = True

    def event(self, curve: loss_evidence.Curve, metrics: dict[str, float]) -> SemanticEvent:
        metrics["shape"] = CLIMBING if curve.verdict == "climbing" else ABOVE_CHANCE if curve.above_chance else STOPPED
        return run_event(KIND, curve.start.first, curve.end.last, curve.large_updates, **metrics)

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
