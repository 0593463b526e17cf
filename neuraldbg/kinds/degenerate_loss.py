"""A degenerate loss: backward passes ran, but the gradient of the loss with respect to the model's output and every
parameter gradient were exactly zero on every fully observed step (``cross_entropy`` on one output unit, a loss
multiplied by 0): nothing can be learned, whatever the layers do. The exactly-zero gradients, the stalls and the
frozen-looking parameters that follow are its effects."""

from __future__ import annotations

import math

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..health import GradientHealth, UpdateHealth
from ..reasoning.rules import CausalRule, ExactlyZeroGradients
from ..reasoning.topology import Topology
from ..text import count, num
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.DEGENERATE_LOSS


class DegenerateLoss(Kind):
    name = KIND.value
    run_level = True
    tier = 0

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        if not (
            coverage.steps_with_gradient
            and coverage.steps_with_nonzero_gradient == 0
            and coverage.loss_gradient_readings
            and coverage.zero_loss_gradient == coverage.loss_gradient_readings
        ):
            return None
        metrics = {"steps": float(coverage.steps)}
        if coverage.last_loss is not None and math.isfinite(coverage.last_loss):
            metrics["loss"] = coverage.last_loss
        return run_event(KIND, 0, max(coverage.last_step, 0), "", **metrics)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(0, order=2)

    def rules(self) -> list[CausalRule]:
        return [
            ExactlyZeroGradients(
                "degenerate-loss-zeroes-gradients",
                "zeroes the gradient of",
                KIND,
                (GradientHealth.VANISHING,),
                same_place_joins=True,
            ),
            CausalRule("degenerate-loss-stops-updates", "stops", KIND, (UpdateHealth.STALLED,), same_place_joins=True),
            CausalRule(
                "degenerate-loss-freezes", "stops the updates of", KIND, (UpdateHealth.FROZEN,), same_place_joins=True
            ),
        ]

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        loss = m.get("loss")
        value = f" (loss {num(loss)})" if loss is not None else ""
        what = (
            f"Degenerate loss: at all {count(m.get('steps', 0.0))} observed steps{value} the gradient of the loss "
            "with respect to the model's output is exactly zero, so no parameter can learn, whatever the layers do. "
            "Typical causes: cross_entropy on a model with a single output unit (the log-softmax of one logit is "
            "always 0), a loss multiplied by 0, or a loss that does not depend on the output."
        )
        fix = (
            "check the loss: for two classes with one output unit use "
            "binary_cross_entropy_with_logits (BCEWithLogitsLoss) with float targets, or give the model one output "
            "per class for cross_entropy; remove any factor that makes the loss constant."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        loss = event.metrics.get("loss")
        value = f", loss {num(loss)}" if loss is not None else ""
        return f"exactly zero gradient with respect to the model's output at every step{value}"

    def place(self, event: SemanticEvent) -> str:
        return "the loss"
