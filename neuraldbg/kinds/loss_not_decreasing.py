"""A loss that does not decrease: over the run it fell by less than its own batch-to-batch spread.

Judged against the loss's own noise, never against a fixed number (see :mod:`.loss_evidence`): the mean of its
first eighth against the mean of its last quarter, on runs of ``loss_min_steps`` losses or more, with one
objective (not a GAN's, a policy gradient's or layers trained apart) and the run watched from its optimizer's
first step (a run attached later may have converged before). A loss that fell within its first eighth is not
flat, though the eighth's mean already sits at its end: one that ended at a tenth of its first losses, or that fell
from them (or from its chance level, when its first loss lay there) by a spread and two standard errors to an end a
spread below the band around its chance level (log(classes), the labels' entropy, a BCE's or an MSE's targets'
level). A weak-signal task learns in a few dozen steps and then sits at its noise floor (sweep K: a 3-class toy at
0.60 against log 3 = 1.10, a tabular BCE at 0.54 against 0.68, both at their Bayes optimum). A classifier's loss at
chance is :mod:`.loss_at_chance`'s; a fault that began first explains it.
"""

from __future__ import annotations

from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, num
from . import loss_evidence
from .base import Series

KIND = FailureKind.LOSS_NOT_DECREASING


class LossNotDecreasing(loss_evidence.LossKind):
    name = KIND.value
    title = "loss not decreasing"
    loss_order = 3

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        start, end, noise = m.get("start", 0.0), m.get("end", 0.0), m.get("noise", 0.0)
        what = (
            f"The loss did not decrease: over {count(m.get('losses', 0.0))} steps it went from {num(start)} (its "
            f"first steps) to {num(end)} (steps {int(m.get('end_from', root.step_end))}-{root.step_end}), a change "
            f"of {num(end - start)}, smaller than its batch-to-batch spread ({num(noise)}): the model is not "
            "learning."
        )
        causes, fix = loss_evidence.ranked(m, "flat", detail=root.detail)
        return what + causes, fix

    def describe(self, event: SemanticEvent) -> str:
        m = event.metrics
        return f"loss not decreasing ({num(m.get('start', 0.0))} to {num(m.get('end', 0.0))})"

    def label(self, event: SemanticEvent) -> str:
        return f"loss flat: {num(event.metrics.get('end', 0.0))}"

    def effect(self, event: SemanticEvent) -> str:
        return "a loss that does not fall"
