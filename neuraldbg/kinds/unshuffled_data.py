"""Data not shuffled: the training batches arrive sorted by label, so each optimizer step sees (almost) one class.

Each step then pulls the model towards the class of its batch: the loss jumps where the class changes, the model
forgets the classes it saw first and ends biased towards the last ones (plain torch, a 10-class MLP on data sorted by
label with ``DataLoader(shuffle=False)``, Adam 1e-3, batches of 32: held-out accuracy 0.23-0.36 against 0.60-0.64
shuffled after one epoch, seeds 0-2; 0.74-0.76 against 0.79-0.82 after five, seeds 0-1). Nothing in the gradients,
the activations or the updates shows it: each step is a sound step on its own batch.

Read from the labels of a classifier's loss (the ``nll_loss`` under a cross-entropy, one label per row) on the
fully observed steps (see :mod:`~neuraldbg.capture.label_mix`): found when, over at least :data:`MIN_STEPS` steps
of :data:`~neuraldbg.stats.tensors.MIXED_MIN_LABELS` labels or more, a step's most frequent class holds at least
:data:`STEP_SHARE` of its labels on average while all those labels pooled hold no class above :data:`POOLED_SHARE`.
Batches drawn at random mix the classes as the data do: a batch of 32 over 10 balanced classes holds its most
frequent class at about 0.2, a batch of 8 labels drawn from a pool of 80 % one class holds it at 0.8 on average
(below the step's share by a tenth, the least mixed random batches this rule accepts); data of one class mostly are
that class in the pool as well, and so are the labels of a contrastive loss whose positive is always column 0; a
sampler of a few classes per batch (P x K for a metric loss) holds 1 / P of each; a step that takes one pass per
class (a GAN's discriminator on real then generated images) is counted as one step, mixed.
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, pct
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.UNSHUFFLED_DATA

#: Fully observed steps whose labels must have been read.
MIN_STEPS = 8
#: A step's most frequent class holds at least this share of its labels, on average over the steps ...
STEP_SHARE = 0.9
#: ... while all the steps' labels together hold no class above this share.
POOLED_SHARE = 0.8


class UnshuffledData(Kind):
    name = KIND.value
    title = "data not shuffled"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        if len(coverage.label_mixing) != 5:
            return None
        _, step_share, pooled_entropy, pooled_share, steps = coverage.label_mixing
        if steps < MIN_STEPS or step_share < STEP_SHARE or pooled_share > POOLED_SHARE:
            return None
        rows = coverage.training.rows
        first = rows[0].step if rows else 0
        return run_event(
            KIND,
            first,
            max(first, coverage.last_step),
            step_share=step_share,
            pooled_share=pooled_share,
            pooled_entropy=pooled_entropy,
            steps=steps,
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # the data pipeline's, in force from the first step: before the loss findings it leaves
        return RootLane(0, order=3) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the data's order

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        what = (
            f"The training data are not shuffled: the batches arrive sorted by label. On {count(m.get('steps', 0.0))} "
            f"fully observed steps from step {root.step_start}, a step's most frequent class held "
            f"{pct(m.get('step_share', 0.0))} of its labels on average, while over all those steps no class held "
            f"more than {pct(m.get('pooled_share', 0.0))}. Each step pulls the model towards one class: the loss "
            "jumps where the class changes, the model forgets the classes it saw first and ends biased towards the "
            "last ones, while each step's gradients look sound."
        )
        fix = (
            "shuffle the training data: DataLoader(dataset, shuffle=True), or a new torch.randperm order each epoch "
            "when batching by hand; data built by concatenating one class after another need it most."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"batches of one class ({pct(event.metrics.get('step_share', 0.0))} of a step's labels on average)"
