"""No training step observed: the model was never trained while NeuralDBG watched it (an empty loader, validation
only, another model object trained). Nothing about the training can be concluded, so the run is inconclusive,
never healthy. Root: first of all, ranked with the findings that say nothing can be learned.

A model with no trainable parameter (``requires_grad=False`` on all of them) through which an optimizer stepped
tensors outside it is such a run, whatever steps were seen: an input optimised through a frozen feature net (style
transfer, an adversarial example) trains nothing of the model. With its layers called one by one (``for layer in
vgg: h = layer(h)``) the passes counted of the model say little (1 forward pass and no backward pass counted where
plain torch ran 100 of each through its layers and 100 optimizer steps of the image): the explanation names what is
known instead, the missing trainable parameters and the optimizer steps of other tensors."""

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
        if coverage.failures:  # a debugger that failed says so itself, not "no training"
            return None
        # nothing of a model with no trainable parameter trains, however many steps of other tensors were seen
        if coverage.steps and not _stepped_around(facts.trainable, coverage.foreign_optimizer_steps):
            return None
        return run_event(
            KIND,
            0,
            0,
            forwards=coverage.forwards,
            no_grad_forwards=coverage.no_grad_forwards,
            eval_forwards=coverage.eval_forwards,
            other_thread_forwards=coverage.other_thread_forwards,
            trainable=facts.trainable,
            foreign_optimizer_steps=coverage.foreign_optimizer_steps,
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(0, order=0)

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        forwards, foreign = int(m.get("forwards", 0.0)), int(m.get("foreign_optimizer_steps", 0.0))
        no_grad, evals, threads = (
            int(m.get(k, 0.0)) for k in ("no_grad_forwards", "eval_forwards", "other_thread_forwards")
        )
        if _stepped_around(m.get("trainable", 1.0), foreign):
            what = (
                "No training of the model to judge: it has no trainable parameter (none with requires_grad=True), and "
                f"the {count(foreign)} optimizer steps taken while it was watched stepped tensors outside "
                "it - an input optimised through it (style transfer, an adversarial example). Nothing of the model "
                "was trained, so nothing about its training can be concluded."
            )
            fix = (
                "nothing to fix if the model is meant to stay fixed: NeuralDBG judges the training of the model it "
                "watches, so watch the model that trains, if any. If this one is meant to learn, set "
                "requires_grad=True on its parameters and give them to the optimizer."
            )
            return what, fix
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
        m = event.metrics
        foreign = m.get("foreign_optimizer_steps", 0.0)
        if _stepped_around(m.get("trainable", 1.0), foreign):
            return f"no training of the model (no trainable parameter; {count(foreign)} steps of other tensors)"
        return f"no training step observed ({count(m.get('forwards', 0.0))} forward passes seen)"


def _stepped_around(trainable: float, foreign_steps: float) -> bool:
    """A model with no trainable parameter while optimizers that hold none of it stepped: what trains lies outside
    it (an input optimised through a frozen network)."""
    return not trainable and foreign_steps > 0
