"""An activation before a loss that applies its own: the model's logits pass through a softmax, a ReLU or a
sigmoid before ``cross_entropy`` / ``nll_loss(log_softmax(...))`` or ``binary_cross_entropy_with_logits``, which
normalise raw logits themselves.

Found from the loss's autograd graph on the first backward passes that reach the model (see
:mod:`neuraldbg.capture.loss_graph`): exact, with no statistics and no threshold, whatever the loss does. Each
activation harms the training its own way. A softmax before ``cross_entropy`` squashes the logits into [0, 1]: the
loss cannot fall below log(e + C - 1) - 1 (1.46 for 10 classes) and its gradient shrinks as the model grows
confident. A ReLU cuts every negative logit to 0, whose gradient is then exactly 0: a class can only be pushed down
to 0, never below the others. A sigmoid before a loss with logits confines them to (0, 1), so no prediction can be
confident. The root layer is the layer whose output the activation is (``nn.ReLU`` at the end of a
``Sequential``), or, for a functional one (``F.relu`` in ``forward``, ``softmax`` in the loop), the layer whose
output it took.

A softmax before ``binary_cross_entropy`` (``nn.BCELoss``, which takes probabilities) is a fault only for targets
with more than one positive label along the softmax's dimension (multi-label tags): the softmax makes the values of
a row sum to 1, so at most one of them can approach 1 while ``BCELoss`` asks each its own label, and every row with
two or more tags is pushed towards outputs it cannot take. Judged from the targets of the first backward passes (the
positive labels per row, averaged; one-hot rows, where a softmax can reach the targets, give 1): at least
:data:`MULTI_LABEL` (a multi-label MLP of 6 tags at about 2.4 per row: held-out F1 0.26 against 0.97 with a sigmoid).
"""

from __future__ import annotations

import math

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import num
from .base import Kind, RootLane, Series, layer_event

KIND = FailureKind.ACTIVATION_BEFORE_LOSS

#: The ``binary`` metric: 1 for a binary loss with logits, 0 for cross-entropy.
_BINARY = "binary_cross_entropy_with_logits"
#: Positive labels per row of a binary cross-entropy's targets, on average, from which a softmax before it cannot
#: reach them (one-hot targets give 1; a quarter of the rows holding a second tag, 1.25).
MULTI_LABEL = 1.25


class ActivationBeforeLoss(Kind):
    name = KIND.value
    title = "activation before the loss"
    run_level = True  # about the program's loss as a whole (its event still names the layer of the activation)

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        found = coverage.activated_loss
        if found is None:
            return self._softmax_before_bce(coverage)
        activation, loss, layer, step = found
        metrics = {"binary": float(loss == _BINARY), "classes": float(coverage.training.classes)}
        return layer_event(KIND, layer, step, coverage.last_step, metrics, activation)

    def _softmax_before_bce(self, coverage: Coverage) -> SemanticEvent | None:
        """A softmax before ``binary_cross_entropy`` whose targets hold :data:`MULTI_LABEL` positive labels per row
        or more (see the module docstring)."""
        found, positives = coverage.softmax_bce, coverage.softmax_positives
        if found is None or not positives >= MULTI_LABEL:
            return None
        layer, step = found
        metrics = {"binary": 0.0, "probabilities": 1.0, "positives": positives}
        return layer_event(KIND, layer, step, coverage.last_step, metrics, "softmax")

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # right after dead units: output units a ReLU on the logits killed are that ReLU's dead neurons, whose
        # explanation already says to remove it; before saturation and every later rank
        return RootLane(3.5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the program computes its loss this way from the first step

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        activation = root.detail or "an activation"
        binary = root.metrics.get("binary", 0.0) == 1.0
        if root.metrics.get("probabilities") == 1.0:
            return _softmax_tags(root)
        loss = "binary_cross_entropy_with_logits" if binary else "cross_entropy (log_softmax, then nll_loss)"
        where = f"the output of '{root.layer}'" if root.layer else "the model's output"
        what = (
            f"A {activation} before a loss that applies its own: from step {root.step_start}, {where} passes "
            f"through {activation} before {loss}, which expects raw logits and normalises them itself. "
        )
        what += _harm(activation, binary, root.metrics.get("classes", 0.0))
        if binary:
            fix = (
                f"remove the {activation} and give binary_cross_entropy_with_logits (BCEWithLogitsLoss) the raw "
                "logits; apply torch.sigmoid only to read probabilities at inference."
            )
        else:
            fix = (
                f"remove the {activation} and give cross_entropy (CrossEntropyLoss) the raw logits of the last "
                "layer; apply softmax only to read probabilities at inference."
            )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        if event.metrics.get("probabilities") == 1.0:
            return "softmax before binary_cross_entropy on multi-label targets"
        loss = "a loss with logits" if event.metrics.get("binary", 0.0) == 1.0 else "cross_entropy"
        return f"{event.detail or 'an activation'} before {loss}"

    def label(self, event: SemanticEvent) -> str:
        return f"{event.detail or 'activation'} before the loss"

    def effect(self, event: SemanticEvent) -> str:
        return "logits squashed before the loss"


def _harm(activation: str, binary: bool, classes: float) -> str:
    """What the activation does to the training, in words."""
    if activation == "softmax" and not binary and classes > 1:
        floor = math.log(math.e + classes - 1) - 1
        return (
            f"On probabilities the loss cannot fall below {num(floor)} (log(e + {int(classes)} - 1) - 1, reached "
            "only by a one-hot output), and its gradient shrinks as the model grows confident: the model learns "
            "slowly and stops early."
        )
    if activation == "softmax":
        return (
            "On probabilities the loss cannot reach its minimum, and its gradient shrinks as the model grows confident."
        )
    if activation == "ReLU":
        return (
            "Every negative logit is cut to 0 and gets exactly zero gradient: a wrong class can only be pushed down "
            "to 0, never below the others, and the samples whose logits are all cut give no gradient at all."
        )
    return (
        "The logits are confined to (0, 1), so no prediction can be confident: the loss stays high and its gradient "
        "small."
    )


def _softmax_tags(root: SemanticEvent) -> tuple[str, str]:
    """The explanation and fix of a softmax before ``binary_cross_entropy`` on multi-label targets."""
    where = f"the output of '{root.layer}'" if root.layer else "the model's output"
    what = (
        f"A softmax before a multi-label loss: from step {root.step_start}, {where} passes through softmax before "
        "binary_cross_entropy (BCELoss), which asks each output for its own label, and the targets hold "
        f"{num(root.metrics.get('positives', 0.0))} positive labels per row on average. A softmax makes each row's "
        "outputs sum to 1: at most one of them can approach 1, so every row with two or more labels is pushed "
        "towards outputs it cannot take, and the labels compete where they should be independent."
    )
    fix = (
        "replace the softmax with a sigmoid (each label its own probability), or better, give "
        "binary_cross_entropy_with_logits (BCEWithLogitsLoss) the raw logits; softmax suits one label per row."
    )
    return what, fix
