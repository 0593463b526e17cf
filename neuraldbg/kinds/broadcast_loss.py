"""A loss broadcast across samples: the prediction and the target had shapes that broadcast to a grid of every
sample's prediction against every sample's target, ``(N, 1)`` against ``(N,)`` giving ``(N, N)``. The loss then
pulls each prediction towards the mean of all the batch's targets, and the model learns to predict that mean,
whatever its inputs (plain torch, a temporal conv net whose ``(N, 1, T)`` output met an ``(N, T)`` target in
``mse_loss``: R^2 0.04-0.08 against 0.98, the loss held at the targets' variance). ``mse_loss``, ``smooth_l1_loss``
and ``huber_loss`` warn about it ("Using a target size ... that is different to the input size") and go on; a
difference taken by hand does not warn at all.

Read from the shapes in the loss's autograd graph on the first backward passes (see
:func:`~neuraldbg.capture.loss_graph.crossed`): no value is read. Reported at once, at any length of run: the
shapes are the fault whatever the loss did.
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.BROADCAST_LOSS


def _shape(dims: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


class BroadcastLoss(Kind):
    name = KIND.value
    title = "loss broadcast across samples"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        found = coverage.crossed_loss
        if found is None:
            return None
        loss, prediction, compared, layer, step = found
        detail = f"{loss}|{_shape(prediction)}|{_shape(compared)}|{layer}"
        return run_event(KIND, step, max(step, coverage.last_step), detail, samples=float(prediction[0]))

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # the loop as written, in force from the first step: before the loss findings it leaves
        return RootLane(0, order=6) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the code, not the learning rate

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        loss, prediction, compared, layer = [*root.detail.split("|", 3), "", "", "", ""][:4]
        whose = f" (the output of '{layer}')" if layer else ""
        samples = int(root.metrics.get("samples", 0.0))
        given = f"{loss} was given" if loss != "a difference taken by hand" else "a difference taken by hand took"
        what = (
            f"The loss compared every sample's prediction with every sample's target: {given} a prediction of shape "
            f"{prediction}{whose} and a target that broadcast against it to {compared}, from step {root.step_start}. "
            f"Each of the {samples} predictions of a batch is pulled towards the targets of all the others, so the "
            "model learns their mean, whatever its inputs, and the loss stays near the targets' variance."
        )
        fix = (
            "give the prediction and the target the same shape before the loss: squeeze the prediction's extra "
            "dimension (out.squeeze(1), out.view(-1)) or unsqueeze the target (y.unsqueeze(1)); torch warns 'Using a "
            "target size ... that is different to the input size' when mse_loss meets this."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        parts = event.detail.split("|", 3)
        compared = parts[2] if len(parts) > 2 else ""
        return f"loss broadcast across samples to {compared}"

    def place(self, event: SemanticEvent) -> str:
        return "the loss"
