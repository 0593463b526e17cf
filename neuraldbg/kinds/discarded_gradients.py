"""Discarded gradients: most backward passes that reached the model had their gradient reset by ``zero_grad()``
before any optimizer step used it, so the optimizer learns from a small fraction of the batches.

Counted exactly, with no statistics (see :mod:`neuraldbg.capture.ledger`): a backward pass between two optimizer
steps that finds the gradients reset while an earlier pass since the last step had left its own threw that one
away. The usual cause is ``optimizer.step()`` indented out of the batch loop: ``zero_grad()`` and ``backward()``
run every batch, the step once per epoch, and only the last batch of each epoch moves the weights (32 batches an
epoch for 10 epochs: 279 of the 288 passes after the first step thrown away, 10 steps; held-out accuracy 0.36
against 0.77 with the step in the loop). Reported when at least :data:`MIN_PASSES` passes, :data:`SHARE` of those
between optimizer steps, were thrown away, and the stretches of passes before most steps held one.

Healthy schemes stay far from both bars: gradient accumulation adds the passes up (no reset between them), a
closure's passes (LBFGS) are the step's own, two optimizers stepping together close one stretch. A GAN's
discriminator, whose ``.grad`` also receives the generator's backward pass until its next ``zero_grad()``, throws
away one pass in two (one in three with the real and fake losses backpropagated apart), as does sharpness-aware
minimisation's first pass; a validation that calls ``backward()`` each epoch throws away a share of the passes,
but before one step in an epoch's.
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.DISCARDED_GRADIENTS

#: Backward passes thrown away, at least (a few can be a loop's odd iterations).
MIN_PASSES = 6
#: ... and at least this share of the backward passes between optimizer steps (a GAN's discriminator: a half).
SHARE = 0.75
#: ... and at least this share of the stretches of backward passes closed by an optimizer step held one (a
#: validation that calls backward() once an epoch: one stretch in an epoch's).
STEP_SHARE = 0.5
#: ... and at least this many such stretches: an optimizer that never stepped (every step skipped by a GradScaler
#: whose scale never fits, a step forgotten) applied no gradient at all, which its own findings say; a step that
#: runs less often than the passes is what this kind is about.
MIN_STEPS = 2


class DiscardedGradients(Kind):
    name = KIND.value
    title = "discarded gradients"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        discarded, passes = coverage.discarded_backwards, coverage.optimizer_backwards
        if discarded < MIN_PASSES or discarded < SHARE * passes:
            return None
        if coverage.step_intervals < MIN_STEPS or coverage.discarding_intervals < STEP_SHARE * coverage.step_intervals:
            return None
        return run_event(
            KIND,
            max(coverage.first_discarded, 0),
            max(coverage.last_step, 0),
            discarded=discarded,
            backward_passes=passes,
            optimizer_steps=facts.optimizer_steps,
            intervals=coverage.step_intervals,
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(0, order=4)

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        discarded, passes = m.get("discarded", 0.0), m.get("backward_passes", 0.0)
        steps = m.get("optimizer_steps", 0.0)
        kept = max(passes - discarded, 1.0)
        what = (
            f"Gradients discarded: from step {root.step_start}, {count(discarded)} of the {count(passes)} backward "
            "passes that reached the model between optimizer steps had their gradient reset by zero_grad() before "
            "any optimizer.step() used it; only the last backward pass before each step moved the weights "
            f"(about 1 in {round(passes / kept)}, and {count(steps)} optimizer steps in all). optimizer.step() runs "
            "less often than loss.backward() and zero_grad(): typically it sits outside the batch loop (indented "
            "one level too little), so it runs once per epoch. The model learns from a small fraction of its "
            "batches."
        )
        fix = (
            "call optimizer.step() once per batch, inside the batch loop, right after loss.backward(); if gradient "
            "accumulation was meant, call optimizer.zero_grad() only after optimizer.step(), not before every "
            "backward pass."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        m = event.metrics
        return (
            f"gradients of {count(m.get('discarded', 0.0))} of {count(m.get('backward_passes', 0.0))} backward "
            "passes reset before any optimizer step used them"
        )

    def place(self, event: SemanticEvent) -> str:
        return "the run"
