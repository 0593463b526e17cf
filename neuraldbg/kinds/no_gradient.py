"""No gradient: training steps were taken, but no gradient ever reached a trainable parameter (``loss.backward()``
forgotten, or the loss detached from the graph): every fully observed step carried no gradient. The model cannot
learn, whatever its layers do; the zero gradients and the stillness that follow are its effects.

Or the gradients reached the parameters and were gone when the optimizer stepped: after a backward pass reached
parameters an optimizer owns, every one of them had ``.grad`` None at that optimizer's step, on most steps
(exact, see :mod:`neuraldbg.capture.ledger`). Two loops do it, told apart by whether a forward pass of the model
came between that backward pass and the step: ``optimizer.zero_grad()`` between ``loss.backward()`` and
``optimizer.step()`` (none came), or ``optimizer.step()`` before ``loss.backward()`` with the reset at the top of the
loop (zero_grad, forward, step, backward: the step follows the forward pass whose backward pass is still to come;
under Adam every step moved nothing, held-out accuracy 0.30 against 0.77 in the right order). Each gets its own
fix."""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts, trained_elsewhere
from ..events import FailureKind, SemanticEvent
from ..health import GradientHealth, UpdateHealth
from ..reasoning.rules import CausalRule, ExactlyZeroGradients
from ..reasoning.topology import Topology
from ..text import count
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.NO_GRADIENT
#: Steps whose gradients were reset before the optimizer applied them, at least (one or two can be a loop's
#: first iterations)...
CLEARED_STEPS = 3
#: ... and at least this share of the optimizer steps that followed a backward pass reaching their parameters.
CLEARED_SHARE = 0.5


class NoGradient(Kind):
    name = KIND.value
    run_level = True
    tier = 0

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        found = _cleared(coverage)
        if found is not None:
            first, cleared, handed, how = found
            step_first = coverage.forward_before_step >= CLEARED_SHARE * coverage.handed_steps
            return run_event(
                KIND,
                max(first, 0),
                max(coverage.last_step, 0),
                steps=coverage.steps,
                cleared_steps=cleared,
                handed_steps=handed,
                zeroed=how,
                step_first=float(step_first),
                trainable_parameters=facts.trainable,
                backward_passes=facts.backward_passes,
                optimizer_steps=facts.optimizer_steps,
            )
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
        if "cleared_steps" in m:
            return _explain_cleared(m)
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
        if "cleared_steps" in m:
            if m.get("step_first"):
                return f"optimizer.step() before loss.backward() on {count(m['cleared_steps'])} optimizer steps"
            return (
                f"gradients reset before {count(m['cleared_steps'])} of {count(m.get('handed_steps', 0.0))} "
                "optimizer steps"
            )
        return (
            f"no gradient reached the {count(m.get('trainable_parameters', 0.0))} trainable parameters "
            f"({count(m.get('steps', 0.0))} optimizer steps, {count(m.get('backward_passes', 0.0))} backward passes)"
        )

    def place(self, event: SemanticEvent) -> str:
        return "the loss"


def _cleared(coverage: Coverage) -> tuple[int, int, int, float] | None:
    """Gradients reset between the backward pass and the optimizer step on most steps: (the first such step, the
    steps, the steps judged, 1.0 when zeroed in place else 0.0), or None. Set to None: every optimizer step is
    judged; zeroed in place: the fully observed ones."""
    for first, cleared, handed, how in (
        (coverage.first_cleared, coverage.cleared_steps, coverage.handed_steps, 0.0),
        (coverage.first_zeroed, coverage.zeroed_steps, coverage.left_readings, 1.0),
    ):
        if cleared >= CLEARED_STEPS and cleared >= CLEARED_SHARE * handed:
            return first, cleared, handed, how
    return None


def _explain_cleared(m: dict[str, float]) -> tuple[str, str]:
    """The words of gradients reset between the backward pass and the optimizer step, by the order that did it."""
    cleared, handed = int(m["cleared_steps"]), int(m.get("handed_steps", 0.0))
    steps = "every one" if cleared == handed else f"{count(cleared)}"
    observed = " observed in full" if m.get("zeroed") else ""
    reset = "zeroed in place" if m.get("zeroed") else "reset to None"
    outcome = "The model cannot learn." if cleared == handed else "The model does not learn on those steps."
    if m.get("step_first"):
        what = (
            f"No gradient reached the optimizer: optimizer.step() is called before loss.backward(). On {steps} of "
            f"{count(handed)} optimizer steps{observed}, the step came after the forward pass but before that loss's "
            f"backward pass, when the gradients the previous backward pass left had already been {reset} by "
            "optimizer.zero_grad() (or model.zero_grad()) at the top of the loop, so those steps moved nothing; each "
            f"backward pass's gradients are then reset before any step uses them. {outcome}"
        )
        fix = (
            "call loss.backward() before optimizer.step(): optimizer.zero_grad(), the forward pass and the loss, "
            "loss.backward(), then optimizer.step(), in that order."
        )
        return what, fix
    what = (
        f"No gradient reached the optimizer: loss.backward() left gradients on the parameters before {steps} of "
        f"{count(handed)} optimizer steps{observed}, but they had been {reset} when optimizer.step() ran, so those "
        "steps moved nothing: optimizer.zero_grad() (or model.zero_grad()) is called between loss.backward() and "
        f"optimizer.step(). {outcome}"
    )
    fix = (
        "call optimizer.zero_grad() before the forward pass (or right after optimizer.step()), never between "
        "loss.backward() and optimizer.step()."
    )
    return what, fix
