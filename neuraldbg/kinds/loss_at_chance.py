"""A loss at chance: a classifier's loss ends within ``loss_chance_band`` of log(classes), the cross-entropy of
predicting every class with equal probability, although gradients flow and the optimizer moves the weights.

The number of classes is the last dimension of the model's (logit) output, read from its shape on fully observed
steps (a Hugging Face output's ``logits``; one output unit is a binary classifier, log 2); the curve must start at
or above 0.8 log(classes), where an untrained classifier's cross-entropy is, so that a regression whose output
happens to have a last dimension is not taken for a classifier. Judged on runs of ``loss_min_steps`` losses or
more (see :mod:`.loss_evidence`); a fault that began first (dead units, stalled updates) explains it.

When the classes are imbalanced, chance is lower: a classifier whose inputs say nothing about its labels learns
their frequencies and settles at their entropy (a character-level GRU given shuffled targets: 2.47 nats, the
characters' unigram entropy, below log 17 = 2.83). The labels an ``nll_loss`` was given on the first backward
passes are counted on the device for it (see :func:`.loss_evidence.label_prior`); the loss is at chance within the
band of the lower of the two. A loss above the band of log(classes) stays the unstable-loss room's.
"""

from __future__ import annotations

from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, num
from . import loss_evidence
from .base import Series

KIND = FailureKind.LOSS_AT_CHANCE


class LossAtChance(loss_evidence.LossKind):
    name = KIND.value
    title = "loss at chance"
    loss_order = 1

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        classes = int(m.get("classes", 0.0))
        chance = num(m.get("chance", 0.0))
        if "prior" in m:
            guess = (
                f"{num(m['prior'])}, the entropy of the labels' frequencies: the loss of predicting each class with "
                f"its frequency among the labels (the classes are imbalanced; equal odds would give log({classes}) = "
                f"{chance})"
            )
        elif classes > 1:
            guess = f"log({classes}) = {chance}, the loss of predicting each of the {classes} classes with equal odds"
        else:
            guess = f"log(2) = {chance}, the loss of a binary classifier that always answers 0.5"
        what = (
            f"The loss stayed at chance: over steps {int(m.get('end_from', root.step_end))}-{root.step_end} it "
            f"averaged {num(m.get('end', 0.0))}, within {num(100 * m.get('band', 0.05))}% of {guess} (it started at "
            f"{num(m.get('start', 0.0))}; {count(m.get('losses', 0.0))} steps). The predictions are no better than a "
            "guess, although gradients flow and the optimizer moves the weights."
        )
        causes, fix = loss_evidence.ranked(m, "chance")
        return what + causes, fix

    def describe(self, event: SemanticEvent) -> str:
        m = event.metrics
        if "prior" in m:
            return f"loss at chance ({num(m.get('end', 0.0))}, the entropy of the label frequencies)"
        return f"loss at chance ({num(m.get('end', 0.0))}, log of {count(m.get('classes', 0.0))} classes)"

    def label(self, event: SemanticEvent) -> str:
        return f"loss at chance: {num(event.metrics.get('end', 0.0))}"

    def effect(self, event: SemanticEvent) -> str:
        return "a loss at chance"
