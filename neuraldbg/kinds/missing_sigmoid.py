"""A missing sigmoid: ``binary_cross_entropy`` (``nn.BCELoss``) given raw scores clamped into [0, 1] instead of
probabilities. ``binary_cross_entropy`` refuses values outside [0, 1], so a program that forgot the sigmoid (or
meant ``BCEWithLogitsLoss``) makes the error go away with a clamp: every score the clamp cuts gets no gradient at
all (the clamp passes none outside its bounds), so the outputs stuck beyond a bound stay there until another sample
moves the weights, and the loss is the log of a linear score, not of a probability.

Found from the loss's autograd graph and one reading of values on the first backward passes that reach the model
(see :mod:`neuraldbg.capture.loss_graph`): a clamp made the loss's input, and the share of the values the clamp was
given that lie outside [0, 1] is read on the device before the backward pass frees them, the largest at the flush.
Probabilities clamped away from 0 and 1 for the log (``sigmoid(x).clamp(1e-7, 1 - 1e-7)``, a softmax column, ``(tanh
+ 1) / 2``) have none outside; the raw scores of a fresh linear head have about half of them below 0.
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import num
from .base import Kind, RootLane, Series, layer_event, loss_ends

KIND = FailureKind.MISSING_SIGMOID

#: The share of a clamp's input outside [0, 1], at least, that says the clamp was given scores, not probabilities:
#: probabilities (whatever computed them) have none outside; a fresh linear head's raw scores about half (0.3-0.6
#: in the tests' and benchmarks' heads), and a trained one's still a tenth or more where targets are 0 or 1.
OUTSIDE = 0.05


class MissingSigmoid(Kind):
    name = KIND.value
    title = "missing sigmoid"
    run_level = True  # about the program's loss as a whole (its event still names the layer of the scores)

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        share = coverage.clamped_outside
        if share is None or not share >= OUTSIDE:
            return None
        metrics = {"outside": share, "limit": OUTSIDE}
        metrics |= loss_ends(coverage)
        return layer_event(KIND, coverage.clamped_layer, coverage.clamped_step, coverage.last_step, metrics)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a program's structure, exact from its first step: beside the other losses given the wrong values
        return RootLane(3.5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the program computes its loss this way from the first step

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        where = f"the output of '{root.layer}'" if root.layer else "the model's output"
        what = (
            f"A missing sigmoid: from step {root.step_start}, binary_cross_entropy (BCELoss) is given {where} clamped "
            f"into [0, 1], and {num(100 * m.get('outside', 0.0))}% of the values the clamp was given lie outside "
            "[0, 1] (probabilities have none): they are raw scores, not probabilities. Every score the clamp cuts "
            "gets no gradient at all, and the loss is the log of a linear score rather than of a probability."
        )
        if "last_loss" in m:
            what += f" The loss went from {num(m['first_loss'])} to {num(m['last_loss'])}."
        fix = (
            "give binary_cross_entropy probabilities (torch.sigmoid(scores)), or better, replace it with "
            "binary_cross_entropy_with_logits (BCEWithLogitsLoss) on the raw scores, which applies the sigmoid itself "
            "and is stable; drop the clamp."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        share = num(100 * event.metrics.get("outside", 0.0))
        return f"binary_cross_entropy on clamped raw scores ({share}% outside [0, 1])"

    def label(self, event: SemanticEvent) -> str:
        return "BCE without sigmoid"

    def effect(self, event: SemanticEvent) -> str:
        return "a loss without sigmoid"
