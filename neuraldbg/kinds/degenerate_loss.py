"""A degenerate loss: backward passes ran, but the gradient of the loss with respect to the model's output and every
parameter gradient were exactly zero on every fully observed step (``cross_entropy`` on one output unit, a loss
multiplied by 0, a masked mean over an empty mask), or the gradient was exactly zero on at least half of the steps
where it was read (at least 8): a policy gradient whose policy became deterministic, rewards or a mask that are zero
on most batches. A margin loss met on most batches once the model learned it has converged, and is not degenerate:
no exactly-zero gradient among the first readings, and either the loss had already fallen to near 0 before its
gradient was first exactly zero (the margins met batch by batch as the model learned: a hinge classifier's loss went
0.97, 0.82, 0.64, 0.42, 0.17 ... 0.002 and was exactly 0 from step 14 on, held-out accuracy 0.12 -> 1.00, its lowest
loss before then 0.07 % of its start; a policy made deterministic by one step of a learning rate far too high had not
gone below 25 % of its start), or hard batches still give gradients to the end and their loss fell to a small part of
its start (batch-hard triplets). Cheap steps read the gradient too (the head layer's on a CPU, the loss's on a GPU),
so a long run is judged on all its steps, not only the fully observed ones. A loss that is NaN while its gradient is
exactly zero is a mean over an empty set. A cheap CPU step reads one layer's gradient, the last one's; zeros read
there while every fully observed step (at least 8) found the loss's gradient with respect to the output non-zero are
that layer's, not the loss's (:func:`one_layers_zeros`: a two-headed net whose regression head, the last layer, has
its loss term weighted 0, while the classification head learns). Nothing can be learned on those steps, whatever
the layers do; the exactly-zero gradients, the stalls, the frozen-looking parameters and the NaN loss that follow are
its effects."""

from __future__ import annotations

import math

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..health import ActivationHealth, GradientHealth, UpdateHealth
from ..reasoning.rules import CausalRule, ExactlyZeroGradients
from ..reasoning.topology import Topology
from ..stats.losses import LossTrace
from ..text import count, num
from .base import LAST_RANK, Kind, RootLane, Series, run_event

KIND = FailureKind.DEGENERATE_LOSS

#: Exactly-zero gradient readings that, at half of all readings or more, make a loss degenerate on most steps.
MOSTLY_MIN = 8
#: A loss met on most batches has converged when, after its first exactly-zero gradient, at least this share of
#: the readings still had a gradient (the batches whose margins are not met yet) ...
STILL_GIVEN = 0.05
#: ... the last of them in the last quarter of the run after it, and the loss ended below this part of its start.
FALLEN_TO = 0.25
#: A loss whose lowest reading before its first exactly-zero gradient was at most this part of its start had met
#: its margins by learning (hinge classifiers: 0.01-1 %; the policy made deterministic: 25 %).
NEARED = 0.05


def margin_met(coverage: Coverage) -> bool:
    """Whether the exactly-zero gradients on most steps are a margin loss that the model learned to meet (batch-hard
    triplets, hinge losses: exactly zero once every margin of a batch is met) rather than a loss that gives nothing
    to learn from: none among the first readings (it gave gradients from the start), and either the loss near 0 at
    some step before the first of them (learning met the margins; a policy made deterministic by one step of a rate
    far too high, or a mask that empties in mid-run, leave the loss where it was until then), or gradients still
    given on some batches to the end (a policy made deterministic, its log-probabilities exactly 0, never gives one
    again) with the loss of those batches fallen from its start to near its floor (a mask empty on most batches
    leaves the others' loss where it was)."""
    if coverage.early_zero_readings or coverage.zero_steps is None or not coverage.given_first:
        return False
    # judged on the readings that had a gradient only: the steps that give nothing have a loss of 0 whatever the fault
    began = sum(coverage.given_first) / len(coverage.given_first)
    if not began > 0:
        return False  # a loss below zero has no floor at zero to be met
    first = coverage.zero_steps[0]
    if 0 <= _lowest_before(coverage.losses, first) <= NEARED * began:
        return True
    after = coverage.nonzero_after_zero + coverage.zero_gradient_readings
    if coverage.nonzero_after_zero < STILL_GIVEN * after:
        return False
    if 4 * (coverage.last_nonzero_step - first) < 3 * (coverage.last_step - first):
        return False
    return 0 <= coverage.given_recent <= FALLEN_TO * began


def one_layers_zeros(coverage: Coverage) -> bool:
    """Whether the exactly-zero readings were one layer's, not the loss's: the fully observed steps read the loss's
    gradient with respect to the model's output at least :data:`MOSTLY_MIN` times and never found it exactly zero.
    A cheap CPU step reads the last layer's gradient only; in a model with several heads that layer can be one the
    loss does not use (a regression head whose loss term is weighted 0: its gradient exactly zero on every cheap
    step, while every fully observed step read the loss's gradient at 0.2-0.5 and the classification head learned).
    Steps are observed fully whatever their batch, so a loss that gives nothing on half of the steps or more would
    have shown it on some of them (all 8 missing it by chance: 1 in 256 at most)."""
    return coverage.loss_gradient_readings >= MOSTLY_MIN and coverage.zero_loss_gradient == 0


def _lowest_before(losses: LossTrace, step: int) -> float:
    """The lowest loss recorded before ``step``: among the first ones, kept one by one, and in the blocks that end
    before it (infinite when none was)."""
    kept = [value for at, value in losses.first if at < step]
    return min(kept + [block.low for block in losses.blocks if block.last < step], default=math.inf)


class DegenerateLoss(Kind):
    name = KIND.value
    run_level = True
    tier = 0

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        readings, zeros = coverage.gradient_readings, coverage.zero_gradient_readings
        always = (
            coverage.steps_with_gradient
            and coverage.steps_with_nonzero_gradient == 0
            and coverage.loss_gradient_readings
            and coverage.zero_loss_gradient == coverage.loss_gradient_readings
        )
        mostly = zeros >= MOSTLY_MIN and 2 * zeros >= readings and not one_layers_zeros(coverage)
        if not (always or mostly) or (not always and margin_met(coverage)):
            return None
        metrics = {"steps": float(coverage.steps), "zero_steps": float(zeros), "readings": float(readings)}
        if coverage.last_loss is not None and math.isfinite(coverage.last_loss):
            metrics["loss"] = coverage.last_loss
        if coverage.losses.nonfinite:
            metrics["nan_losses"] = float(coverage.losses.nonfinite)
        if always:
            return run_event(KIND, 0, max(coverage.last_step, 0), "", **metrics)
        first, last = coverage.zero_steps or (0, coverage.last_step)
        metrics["early_zero"] = float(coverage.early_zero_readings)
        return run_event(KIND, first, max(last, coverage.last_step), "", **metrics)

    late_loss_symptom = True  # zero gradients that began in mid-run: an earlier fault's doing, if there was one

    def lane(self, event: SemanticEvent) -> RootLane | None:
        if event.step_start > 0 and event.metrics.get("early_zero", 1.0) == 0:
            # began in mid-run (none of the first readings was zero): after the faults that may have set it off
            return RootLane(LAST_RANK, order=0)
        return RootLane(0, order=2)

    def rules(self) -> list[CausalRule]:
        return [
            CausalRule(
                "degenerate-loss-is-nan",
                "is why the loss is NaN",
                KIND,
                (FailureKind.NON_FINITE,),
                effect_states=(ActivationHealth.NON_FINITE,),
            ),
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
        zeros, readings = m.get("zero_steps", 0.0), m.get("readings", 0.0)
        if m.get("nan_losses"):
            what = (
                f"Degenerate loss: the loss is NaN on {count(m['nan_losses'])} steps while its gradient is exactly "
                "zero: a mean over an empty set (a mask or an index that selects no sample, so the loss is 0/0), "
                "from which no parameter can learn."
            )
            fix = (
                "check the mask or index the loss is taken over: it selects nothing (an empty training split, a "
                "mask built from the wrong column); guard the mean against an empty selection."
            )
            return what, fix
        if readings and zeros < readings:
            what = (
                f"Degenerate loss: the gradient was exactly zero on {count(zeros)} of the {count(readings)} steps "
                f"where it was read, from step {root.step_start}{value}: on those steps the loss gave nothing to "
                "learn from. "
                "Typical causes: a policy whose probabilities were pushed to exactly 0 and 1 (log-probability 0: a "
                "learning rate too high for a policy gradient), rewards or a mask that are zero on most batches, or "
                "a margin loss met from its first batches (a margin far smaller than the distances it compares)."
            )
            fix = (
                "for a policy gradient, lower the learning rate and subtract a baseline (normalised returns); for a "
                "masked loss, check how often the mask is empty; for a margin loss met from the start, raise the "
                "margin or mine harder examples."
            )
            return what, fix
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
        zeros, readings = event.metrics.get("zero_steps", 0.0), event.metrics.get("readings", 0.0)
        if readings and zeros < readings:
            return f"exactly zero gradient on {count(zeros)} of the {count(readings)} steps where it was read{value}"
        return f"exactly zero gradient with respect to the model's output at every step{value}"

    def effect(self, event: SemanticEvent) -> str:
        return "a loss whose gradient is exactly zero"

    def place(self, event: SemanticEvent) -> str:
        return "the loss"
