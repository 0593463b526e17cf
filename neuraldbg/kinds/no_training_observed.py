"""No training step observed: the model was never trained while NeuralDBG watched it (an empty loader, validation
only, another model object trained). Nothing about the training can be concluded, so the run is inconclusive,
never healthy. Root: first of all, ranked with the findings that say nothing can be learned."""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.NO_TRAINING_OBSERVED


class NoTrainingObserved(Kind):
    name = KIND.value
    run_level = True
    inconclusive = True
    tier = 0

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        if coverage.steps or coverage.failures:  # a debugger that failed says so itself, not "no training"
            return None
        return run_event(
            KIND,
            0,
            0,
            forwards=coverage.forwards,
            no_grad_forwards=coverage.no_grad_forwards,
            eval_forwards=coverage.eval_forwards,
            other_thread_forwards=coverage.other_thread_forwards,
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(0, order=0)

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        forwards = int(m.get("forwards", 0.0))
        no_grad, evals, threads = (
            int(m.get(k, 0.0)) for k in ("no_grad_forwards", "eval_forwards", "other_thread_forwards")
        )
        if forwards == 0:
            what = (
                "No training step was observed: the model was never called while NeuralDBG watched it, so nothing "
                "about its training can be concluded."
            )
            fix = (
                "check that the training loop runs inside the `with NeuralDbg(model)` block, that its data loader is "
                "not empty (len(loader) > 0), and that it trains this model object - not a copy, or a model built "
                "after NeuralDBG was attached."
            )
            return what, fix
        parts = [
            f"{count(no_grad)} under torch.no_grad()" if no_grad else "",
            f"{count(evals)} in eval mode with no backward pass" if evals else "",
            f"{count(threads)} in another thread" if threads else "",
        ]
        how = "; ".join(p for p in parts if p)
        what = (
            f"No training step was observed: the model ran {count(forwards)} forward passes while watched"
            + (f" ({how})" if how else "")
            + ", but no backward pass and optimizer step followed any of them. Nothing about its training can be "
            "concluded."
        )
        if no_grad + evals >= forwards:
            fix = (
                "only validation or inference ran under the debugger: put the training loop (model.train(), the "
                "forward pass with gradients, loss.backward(), optimizer.step()) inside the `with NeuralDbg(model)` "
                "block."
            )
        elif threads:
            fix = (
                "the forward passes ran in a thread other than the one that attached NeuralDBG: attach it in the "
                "thread that trains (or call dbg.step() there after each optimizer step)."
            )
        else:
            fix = (
                "call loss.backward() and optimizer.step() on this model's loss inside the `with NeuralDbg(model)` "
                "block, and check that the optimizer holds this model's parameters."
            )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"no training step observed ({count(event.metrics.get('forwards', 0.0))} forward passes seen)"
