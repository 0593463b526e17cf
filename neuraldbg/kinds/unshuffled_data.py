"""Data not shuffled: the training batches arrive sorted by label, so each optimizer step sees (almost) one class.

Each step then pulls the model towards the class of its batch: the loss jumps where the class changes, the model
forgets the classes it saw first and ends biased towards the last ones (plain torch, a 10-class MLP on data sorted by
label with ``DataLoader(shuffle=False)``, Adam 1e-3, batches of 32: held-out accuracy 0.23-0.36 against 0.60-0.64
shuffled after one epoch, seeds 0-2; 0.74-0.76 against 0.79-0.82 after five, seeds 0-1). Nothing in the gradients,
the activations or the updates shows it: each step is a sound step on its own batch.

Read from the labels of a classifier's loss (the ``nll_loss`` under a cross-entropy, one label per row) on the
fully observed steps (see :mod:`~neuraldbg.capture.label_mix`): found when, over at least :data:`MIN_STEPS` steps
of :data:`~neuraldbg.stats.tensors.MIXED_MIN_LABELS` labels or more, a step's most frequent class holds at least
:data:`STEP_SHARE` of its labels on average, no class is the top one of more than :data:`POOLED_SHARE` of the
steps, and consecutive steps keep their class: over :data:`MIN_PAIRS` pairs of consecutive observed steps or more,
the next step has the class of the one before more often than halfway from chance (the sum of the squared shares of
the steps' classes) to always. Sorted data keep a class for a block of steps (2,048 samples of 10 classes in batches
of 64: 3.2 steps a class, kept on about 0.7 of the pairs against 0.55 needed).

The pooled share is of the run's steps, not of the observed ones: every step of the dense phase is observed, later
ones about every 16th, so each observed step counts for the steps it stands for (up to the next observed one).
Counted by observed steps, a class whose block outlasts the dense phase looked like data of one class (sweep D: a GRU on
three classes sorted by label, blocks of ~21 steps; after one epoch class 0 was the top class of 17 of the 18
observed steps, 0.94, after three of 21 of 26, 0.81; by the steps they stand for 0.67 and 0.55; held-out accuracy
0.40 and 0.50 against 0.84 and 0.93 shuffled). A step's own purity, and the chance of keeping a class between two
observed steps, are read on the observed steps as they are: a few sparse readings weighed sixteen times each made
them noisy (the real-programs benchmark's 80 sorted steps of 10 classes, 3.2 steps a class: two of its four sparse
readings straddle two blocks, and their purity of 0.75 weighed as 32 steps took the mean under 0.9). The pairs
are of observed steps at the shortest distance between
two of them (consecutive steps, in the dense phase): pairs 16 steps apart keep a block's class less often, and
mixed in they would blur the test. Batches drawn at random mix the
classes as the data do (a batch of 32 over 10 balanced classes holds its top class at about 0.2); data of one class
mostly are that class in every step (a contrastive loss whose positive is always column 0); a sampler of a few
classes per batch (P x K) holds 1 / P of each; a step that takes one pass per class (a GAN's discriminator on real
then generated images) is one step, mixed; and steps of one class each that change class from step to step are
streams taken in turn, not sorted data (hunt 25: a discriminator stepped on real, then on generated images; a DANN
domain classifier on source, then target; a multi-task loop taking its tasks' heads in turn; a segmentation net
given one random tile a step, each mostly one class).
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

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
#: ... while no class is the most frequent one of more than this share of the steps ...
POOLED_SHARE = 0.8
#: ... and, over at least this many pairs of consecutive observed steps, the next step keeps the class of the one
#: before more often than halfway from what chance gives (the sum of the squared shares of the steps' classes) to
#: always.
MIN_PAIRS = 4


def stretches(steps: list[int]) -> list[int]:
    """The training steps each observed step stands for: those up to the next observed one (the last, as many as
    the one before it). The first steps are observed densely and the rest sparsely, so counting observed steps
    would weigh the first block of sorted data as most of the run."""
    gaps = [b - a for a, b in pairwise(steps)]
    return [*gaps, gaps[-1]] if gaps else [1] * len(steps)


def kept_pairs(readings: list[tuple[int, int, float]]) -> list[bool]:
    """Whether the class was kept, for each pair of observed steps at the shortest distance between two of them
    (consecutive steps, where every step of the dense phase is observed): pairs further apart keep a sorted block's
    class less often, and mixing the two would blur the test."""
    gaps = [b[0] - a[0] for a, b in pairwise(readings)]
    nearest = min(gaps, default=0)
    return [a[1] == b[1] for a, b in pairwise(readings) if b[0] - a[0] == nearest]


class UnshuffledData(Kind):
    name = KIND.value
    title = "data not shuffled"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        readings = sorted(coverage.label_steps)
        if len(readings) < MIN_STEPS:
            return None
        # a batch's own purity reads the same wherever the run is: each observed step one reading of it
        step_share = sum(share for _, _, share in readings) / len(readings)
        # which class tops the steps does not: each observed step counts for the steps it stands for
        weights = stretches([step for step, _, _ in readings])
        weighted: Counter[int] = Counter()
        for w, (_, top, _) in zip(weights, readings, strict=True):
            weighted[top] += w
        pooled_share = max(weighted.values()) / sum(weights)
        if step_share < STEP_SHARE or pooled_share > POOLED_SHARE:
            return None
        pairs = kept_pairs(readings)
        if len(pairs) < MIN_PAIRS:
            return None
        kept = sum(pairs) / len(pairs)
        # the chance of keeping a class from one observed step to the next, from the observed steps' own mix (the
        # pairs are theirs)
        tops = Counter(top for _, top, _ in readings)
        by_chance = sum((n / len(readings)) ** 2 for n in tops.values())
        if kept < (1 + by_chance) / 2:
            return None  # the class changes from step to step: streams taken in turn, or batches drawn at random
        rows = coverage.training.rows
        first = rows[0].step if rows else 0
        return run_event(
            KIND,
            first,
            max(first, coverage.last_step),
            step_share=step_share,
            pooled_share=pooled_share,
            steps=len(readings),
            kept=kept,
            pairs=len(pairs),
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
            f"{pct(m.get('step_share', 0.0))} of its labels on average, and the next step kept that class on "
            f"{pct(m.get('kept', 0.0))} of {count(m.get('pairs', 0.0))} pairs of consecutive steps, while no class "
            f"was the most frequent of more than {pct(m.get('pooled_share', 0.0))} of the steps. Each step pulls "
            "the model towards one class: the loss "
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
