"""A loss at chance: a classifier's loss ends within ``loss_chance_band`` of log(classes), the cross-entropy of
predicting every class with equal probability, although gradients flow and the optimizer moves the weights.

The number of classes is the last dimension of the model's (logit) output, read from its shape on fully observed
steps (a Hugging Face output's ``logits``; one output unit is a binary classifier, log 2); the curve must start at
or above 0.8 log(classes), where an untrained classifier's cross-entropy is, so that a regression whose output
happens to have a last dimension is not taken for a classifier. Judged on runs of ``loss_min_steps`` losses or
more whose updates added up to ``loss_trained`` of the weights' norm (see :mod:`.loss_evidence`); a fault that
began first (dead units, stalled updates) explains it. A loss held at log(classes) batch after batch, its last
quarter spreading by a hundred-thousandth of it or less, is judged after smaller updates too (a tenth of that):
a model whose output ignores its input gives it (a CLIP whose text tower pooled position 0 for every caption:
log 16 to 2.5e-6 of it, updates adding up to 0.09), and its first likely cause says so.

When the classes are imbalanced, chance is lower: a classifier whose inputs say nothing about its labels learns
their frequencies and settles at their entropy (a character-level GRU given shuffled targets: 2.47 nats, the
characters' unigram entropy, below log 17 = 2.83). The labels an ``nll_loss`` was given on the first backward
passes are counted on the device for it (see :func:`.loss_evidence.label_prior`); the loss is at chance within the
band of the lower of the two. A loss above the band of log(classes) stays the unstable-loss room's.

A binary cross-entropy (``binary_cross_entropy_with_logits``, ``BCEWithLogitsLoss``, ``binary_cross_entropy`` on
probabilities) and a mean squared error (``mse_loss``) have a chance level too, which their targets give: a model
whose inputs say nothing about its targets learns what they are on average and no more. A binary cross-entropy
then settles at the mean binary entropy of the labels' base rates (a multi-label classifier given shuffled labels:
0.648, the base rate 0.357 gives 0.651, log 2 = 0.693), a mean squared error at the targets' variance (the loss of
predicting their mean, per output column: shuffled targets, 0.461 against 0.454; R^2 about 0). The targets of the
first backward passes are profiled on the device for it when that loss is the whole loss, averaged, given no
weights and no mask (see :func:`.loss_evidence.target_chance`); the loss is at chance within the band of that
level (up to the band of the pooled level: one rate, or one mean, for every column), under the same gates. A
healthy program whose task holds little signal ends near that level too (a regression whose best R^2 is below
about 0.05): that limit is in docs/limitations.md. A mean squared error that ends at 30 times that level or more
is reported here too, under no gate on the run's length or updates: the predictions are worse than that guess,
off the targets' scale (see :data:`.loss_evidence.FAR_ABOVE`).
"""

from __future__ import annotations

import math

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
        if "baseline" in m:
            return self._explain_targets(root, m)
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
        if "new_loss" in m:
            what = (
                "The loss stayed at chance on samples the model had never seen: over steps "
                f"{int(m.get('new_from', 0.0))}-{int(m.get('new_until', 0.0))}, on the new samples of their batches "
                f"({count(m['new_samples'])} of them) it averaged {num(m['new_loss'])}, at {guess}, while on the "
                f"samples those same batches held again it was {num(m.get('seen_loss', 0.0))}, lower by "
                f"{num(m.get('memorised_gap', 0.0))} at the same weights. The model memorises the labels of the "
                "samples it is shown; it does not learn to predict them from the inputs (the whole loss went from "
                f"{num(m.get('start', 0.0))} to {num(m.get('end', 0.0))} over {count(m.get('losses', 0.0))} steps)."
            )
        else:
            what = (
                f"The loss stayed at chance: over steps {int(m.get('end_from', root.step_end))}-{root.step_end} it "
                f"averaged {num(m.get('end', 0.0))}, within {num(100 * m.get('band', 0.05))}% of {guess} (it started "
                f"at {num(m.get('start', 0.0))}; {count(m.get('losses', 0.0))} steps). The predictions are no better "
                f"than a guess, although {loss_evidence.moving(m)}."
            )
        causes, fix = loss_evidence.ranked(m, "chance", detail=root.detail)
        return what + causes, fix

    def _explain_targets(self, root: SemanticEvent, m: dict[str, float]) -> tuple[str, str]:
        """The explanation of a binary cross-entropy or a mean squared error at its targets' chance level."""
        span = (
            f"over steps {int(m.get('end_from', root.step_end))}-{root.step_end} it averaged {num(m.get('end', 0.0))}"
        )
        level, pooled = m.get("target_level", 0.0), m.get("target_pooled", 0.0)
        tail = (
            f"(it started at {num(m.get('start', 0.0))}; {count(m.get('losses', 0.0))} steps). "
            f"{_sentence(loss_evidence.moving(m))}."
        )
        band = num(100 * m.get("band", 0.05))
        if "far_above" in m:  # the ratio is to the higher of the two levels
            against = (
                f"{num(pooled)}, the variance of all the targets ({num(level)} per output column)"
                if pooled > level
                else f"{num(level)}, the targets' variance per output column"
            )
            what = (
                "The mean squared error stayed far above the targets' variance: the predictions are worse than "
                f"predicting the targets' mean, far off their scale. {span[0].upper()}{span[1:]}, "
                f"{num(m['far_above'])} times {against} {tail}"
            )
        elif m.get("baseline") == loss_evidence.BASELINES["mse"]:
            whole = f", {num(pooled)} over all of them" if pooled > 1.05 * level else ""
            what = (
                f"The mean squared error stayed at the targets' variance: the predictions explain none of it, no "
                f"better than predicting the mean. {span[0].upper()}{span[1:]}, within {band}% of {num(level)}, "
                f"the targets' variance per output column{whole} {tail}"
            )
        else:
            what = (
                f"The loss stayed at chance: {span}, within {band}% of {num(level)}, the mean binary entropy of the "
                f"labels' base rates: the loss of predicting each label with its frequency among the targets "
                f"(equal odds would give log 2 = {num(math.log(2))}) {tail} The predictions are no better than a "
                "guess."
            )
        causes, fix = loss_evidence.ranked(m, "chance", detail=root.detail)
        return what + causes, fix

    def describe(self, event: SemanticEvent) -> str:
        m = event.metrics
        if "new_loss" in m:
            return (
                f"loss at chance on unseen samples ({num(m['new_loss'])}; {num(m.get('seen_loss', 0.0))} on seen ones)"
            )
        if "far_above" in m:
            return f"loss far above the targets' variance ({num(m['far_above'])} times)"
        if m.get("baseline") == loss_evidence.BASELINES["mse"]:
            return f"loss at chance ({num(m.get('end', 0.0))}, the targets' variance)"
        if "baseline" in m:
            return f"loss at chance ({num(m.get('end', 0.0))}, the entropy of the labels' base rates)"
        if "prior" in m:
            return f"loss at chance ({num(m.get('end', 0.0))}, the entropy of the label frequencies)"
        return f"loss at chance ({num(m.get('end', 0.0))}, log of {count(m.get('classes', 0.0))} classes)"

    def label(self, event: SemanticEvent) -> str:
        m = event.metrics
        if "new_loss" in m:
            return f"loss at chance on unseen samples: {num(m['new_loss'])}"
        return f"loss at chance: {num(m.get('end', 0.0))}"

    def effect(self, event: SemanticEvent) -> str:
        return "a loss far above its targets' variance" if "far_above" in event.metrics else "a loss at chance"


def _sentence(words: str) -> str:
    """``words`` opening a sentence: the first letter upper-case, the rest as written (names keep their case)."""
    return words[:1].upper() + words[1:]
