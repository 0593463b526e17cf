"""Training in eval mode: training steps ran their forward pass with ``model.training`` False while the model has
layers whose behaviour depends on the mode (dropout, batch norm with running statistics, recurrent layers and
attention with dropout): dropout was off and batch-norm statistics were frozen while the optimizer stepped."""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count
from .base import Kind, RootLane, Series, held, run_event

KIND = FailureKind.EVAL_MODE_TRAINING


class EvalModeTraining(Kind):
    name = KIND.value
    title = "training in eval mode"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        steps = coverage.eval_steps
        if not (steps and coverage.mode_dependent):
            return None
        return run_event(
            KIND,
            steps[0],
            max(steps[-1], steps[0]),
            ", ".join(coverage.mode_dependent),
            steps=len(steps),
            mode_dependent_layers=len(coverage.mode_dependent),
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(0, order=3)

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        taken = count(m.get("steps", 0.0))
        layers = int(m.get("mode_dependent_layers", 0.0))
        which = f" ({root.detail})" if root.detail else ""
        what = (
            f"The model trained in eval mode: {taken} training steps {held(root, topo)} ran their forward pass "
            f"with model.training False, so its {layers} layer{'s' if layers != 1 else ''} whose behaviour depends on "
            f"the mode{which} behaved as at inference: dropout was off and batch-norm statistics were frozen while "
            "the optimizer stepped."
        )
        fix = (
            "call model.train() before the training loop, and again after every validation pass that calls "
            "model.eval()."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        layers = f": {event.detail}" if event.detail else ""
        return f"trained in eval mode ({count(event.metrics.get('steps', 0.0))} steps{layers})"
