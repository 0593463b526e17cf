"""No gradient: training steps were taken, but no gradient ever reached a trainable parameter (``loss.backward()``
forgotten, or the loss detached from the graph): every fully observed step carried no gradient. The model cannot
learn, whatever its layers do; the zero gradients and the stillness that follow are its effects."""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts, trained_elsewhere
from ..events import FailureKind, SemanticEvent
from ..health import GradientHealth, UpdateHealth
from ..reasoning.rules import CausalRule, ExactlyZeroGradients
from ..reasoning.topology import Topology
from ..text import count
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.NO_GRADIENT


class NoGradient(Kind):
    name = KIND.value
    run_level = True
    tier = 0

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        if not (coverage.full_steps and coverage.steps_with_gradient == 0 and facts.trainable):
            return None
        if trained_elsewhere(coverage, facts):
            return None  # gradients went to other tensors: not seen, not absent (incomplete_observation)
        return run_event(
            KIND,
            0,
            max(coverage.last_step, 0),
            steps=coverage.steps,
            trainable_parameters=facts.trainable,
            backward_passes=facts.backward_passes,
            optimizer_steps=facts.optimizer_steps,
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(0, order=1)

    def rules(self) -> list[CausalRule]:
        return [
            ExactlyZeroGradients(
                "no-gradient-zeroes-gradients",
                "leaves no gradient for",
                KIND,
                (GradientHealth.VANISHING,),
                same_place_joins=True,
            ),
            CausalRule("no-gradient-stops-updates", "stops", KIND, (UpdateHealth.STALLED,), same_place_joins=True),
        ]

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        backward = int(m.get("backward_passes", 0.0))
        params, taken = count(m.get("trainable_parameters", 0.0)), count(m.get("steps", 0.0))
        if backward == 0:
            what = (
                f"No gradient: the optimizer stepped {taken} times, but no backward pass ever reached the model, so "
                f"none of the {params} trainable parameters received a gradient: loss.backward() was never called, "
                "or the loss it was called on does not depend on the model's output (a .detach(), .item() or "
                "torch.tensor(...) between them). The model cannot learn."
            )
            fix = (
                "call loss.backward() after computing the loss and before optimizer.step(), every step, on a loss "
                "computed from the model's output tensor itself."
            )
        else:
            what = (
                f"No gradient: {count(backward)} backward passes ran during {taken} optimizer steps, but no gradient "
                f"reached any of the {params} trainable parameters: the loss is detached from the model's graph "
                "(a .detach(), .item() or .numpy() on the way from the output to the loss, a forward pass under "
                "torch.no_grad(), or a loss rebuilt with torch.tensor(...)). The model cannot learn."
            )
            fix = (
                "compute the loss from the model's output tensor itself, with gradients enabled: remove .detach(), "
                ".item() and torch.tensor(...) between model(x) and the loss, and any torch.no_grad() around the "
                "training forward pass; loss.requires_grad must be True before loss.backward()."
            )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        m = event.metrics
        return (
            f"no gradient reached the {count(m.get('trainable_parameters', 0.0))} trainable parameters "
            f"({count(m.get('steps', 0.0))} optimizer steps, {count(m.get('backward_passes', 0.0))} backward passes)"
        )

    def place(self, event: SemanticEvent) -> str:
        return "the loss"
