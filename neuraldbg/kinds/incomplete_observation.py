"""An incomplete observation: the debugger stopped observing (its own failure, a warning), skipped parameters whose
gradients it cannot read, or never saw a forward pass of the model. Findings from before stand; what came after was
not checked, so the run cannot be called healthy: alone, it makes the verdict inconclusive. A caveat about what was
observed, ranked after every fault."""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts, trained_elsewhere
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, quoted
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.INCOMPLETE_OBSERVATION


class IncompleteObservation(Kind):
    name = KIND.value
    run_level = True
    inconclusive = True
    unobserved = True
    tier = 2

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        last = max(coverage.last_step, 0)
        parts: list[str] = []
        start = last + 1
        if coverage.failures:
            step, what = coverage.failures[0]
            parts.append(what)
            start = min(start, step)
        if coverage.skipped:
            names = sorted(coverage.skipped)
            parts.append(f"the gradients of {quoted(names, 5)} could not be read ({coverage.skipped[names[0]]})")
            start = min(start, coverage.first_skip)
        if coverage.steps and coverage.forwards == 0 and coverage.transformed_forwards:
            parts.append(
                "the watched model ran only inside torch.func transforms (vmap, grad: per-sample gradients, as in "
                "DP-SGD), whose per-sample values are not measured, and with no training forward pass outside them "
                "(one with gradients: a forward under torch.no_grad, for logging or evaluation, is not one) the run's "
                "steps are not told apart: only what its optimizer steps showed was checked"
            )
            start = 0
        elif coverage.steps and coverage.forwards == 0 and coverage.no_grad_forwards:
            parts.append(
                f"the watched model's forward ran {count(coverage.no_grad_forwards)} times, every one under "
                "torch.no_grad (a sampling step, as an RBM's Gibbs step), and the loss the optimizer followed was "
                "computed outside it (another of its methods, an energy function, reading its parameters): the "
                "layers' statistics were not seen, the run's steps are not told apart (counted as one), and only "
                "gradients and updates were checked"
            )
            start = 0
        elif coverage.steps and coverage.forwards == 0:
            parts.append(
                "no forward pass of the watched model was seen (was it called through a copy, torch.func, or "
                "another object?): only gradients and updates were checked"
            )
            start = 0
        if trained_elsewhere(coverage, facts):
            parts.append(
                "the backward passes reached the model's output but none of its parameters: it was run with "
                "parameters that are not its own (torch.func.functional_call, a stateless or copied set of "
                "parameters), and no optimizer stepped its own; the gradients and updates of the tensors that "
                "trained were not observed, only the forward passes"
            )
            start = 0
        if not parts:
            return None
        start = max(0, start)  # may lie past the last observed step: the first step that was not observed
        metrics = {"step": float(start)}
        if coverage.skipped:
            metrics["skipped_parameters"] = float(len(coverage.skipped))
        return run_event(KIND, start, max(last, start), "; ".join(parts), **metrics)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(0, order=4)

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        k = int(m.get("step", root.step_start))
        skipped = int(m.get("skipped_parameters", 0.0))
        detail = f": {root.detail}" if root.detail else ""
        what = f"Observation incomplete from step {k}{detail}."
        if skipped:
            what += f" {count(skipped)} parameters were not measured."
        what += (
            " Findings from before that stand; what came after was not checked, so this run cannot be called "
            "healthy. The training itself was not affected."
        )
        fix = (
            "treat this run's diagnosis as partial; if the detail above points at NeuralDBG rather than the model, "
            "report it with the detail."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return "observation stopped" + (f": {event.detail}" if event.detail else "")
