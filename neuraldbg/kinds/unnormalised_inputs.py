"""Unnormalised inputs to a classifier: the input batch's root-mean-square is :data:`INPUT_RMS` or more (0-255
pixels give about 100) while the model's loss normalises logits itself (cross-entropy: a classifier, whose logits
must come out near unit scale), and the first layer the input meets is no normalisation layer.

Its first layer must then absorb the input's scale: its pre-activations and weight gradients are that many times
larger (and, without a normalisation further on, the logits at initialisation: a first cross-entropy of 6
log(classes) in the real-programs benchmark's MLP), and its updates must undo the scale before they learn the
task. Judged on the input of the fully observed steps of the first quarter of the run (the largest scale among
the call's floating data arguments: raw numeric columns passed after categorical ids count; an additive attention
mask, which holds no positive value, and a non-finite value do not; see
:class:`~neuraldbg.stats.training.TrainingFacts`), capped by the scale at which the data enters the layers with
weights, those that multiply it by a matrix or kernel of their own (linear, convolutional, recurrent, attention;
read on the first fully observed forward passes: the input of the first such calls given a floating input, and of
those given one without a gradient; see ``ForwardPath._note_entry``): a model that divides its raw pixels by 255 or
standardises them (with registered buffers, with tensor ops on each sample, or with a module of per-channel scales
such as RevIN, whose own input is not read) before its first layer with weights feeds that layer normalised data and
is not judged on the raw values (sensor series at 290 K through RevIN: its first Linear receives a root-mean-square
of 1.0), while raw numeric columns concatenated with embeddings before the first linear layer still count. Judged
also on the loss's autograd graph (:mod:`neuraldbg.capture.loss_graph`). A model whose output is on its input's
scale (super-resolution, style transfer on 0-255 images, a regression on raw values) is not a classifier and is not
judged here, unless its loss is a mean squared error whose targets lie near unit scale (variance at most
:data:`UNIT_TARGETS`, read from the targets themselves): a diffusion model fed raw coordinates to predict unit
noise, a regression of standardised targets from raw features. A model that begins with a normalisation layer
(BatchNorm1d on raw tabular features) normalises its inputs itself.
"""

from __future__ import annotations

import math

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import num
from .base import LAST_RANK, Kind, RootLane, Series, run_event

KIND = FailureKind.UNNORMALISED_INPUTS

#: A mean squared error whose targets' variance is at most this is on about unit scale (standard deviation 2 at most):
#: its model's output must come out there, whatever its inputs' scale (a diffusion model's noise, standardised
#: targets), so inputs far from unit scale are this fault as they are a classifier's.
UNIT_TARGETS = 4.0
#: An input batch whose root-mean-square is at least this is far from unit scale (standardised data: about 1;
#: pixels scaled to 0-1: 0.3-0.6; raw 0-255 pixels: 50-130; the real-programs benchmark's healthy classifiers: at
#: most 1.0).
INPUT_RMS = 20.0


#: The losses by value whose targets' variance is read, by the kind the ledger files them under.
_BY_VALUE = {"mse": "mse_loss", "huber": "a Huber loss"}


def _unit_regression(coverage: Coverage) -> str:
    """``"mse_loss"`` (or ``"a Huber loss"``: ``smooth_l1_loss``, ``huber_loss``) when the loss is one whose
    targets' variance (read from them, see :mod:`neuraldbg.capture.ledger`) is at most :data:`UNIT_TARGETS`: a
    regression whose output must come out near unit scale; "" otherwise (a regression on its inputs' scale, or a
    loss whose targets were not read)."""
    found, kind = coverage.target_baseline, coverage.baseline_kind
    if kind not in _BY_VALUE or len(found) != 5 or not 0 < found[1] <= UNIT_TARGETS:
        return ""
    return _BY_VALUE[kind]


class UnnormalisedInputs(Kind):
    name = KIND.value
    title = "unnormalised inputs"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        loss = coverage.classifier_loss or _unit_regression(coverage)
        if not loss or coverage.input_layer_normalizes:
            return None
        training = coverage.training
        rms = training.median("input_rms", 0.0, 0.25)
        if not (math.isfinite(rms) and rms >= INPUT_RMS):
            return None
        first = training.rows[0].step if training.rows else 0
        return run_event(KIND, first, max(first, coverage.last_step), loss, input_rms=rms, limit=INPUT_RMS)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # after every fault of a layer, before the loss findings it explains
        return RootLane(LAST_RANK, order=0) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # a data problem

    def place(self, event: SemanticEvent) -> str:
        return "the input batch"

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        rms = root.metrics.get("input_rms", 0.0)
        fed = (
            f"a regression whose targets lie near unit scale (its loss, {root.detail}, on targets of variance at "
            f"most {num(UNIT_TARGETS)})"
            if root.detail in _BY_VALUE.values()
            else f"a classifier (its loss, {root.detail or 'cross-entropy'}, expects logits near unit scale)"
        )
        what = (
            f"Unnormalised inputs: the input batch's root-mean-square is {num(rms)} (normalised data is about 1; "
            f"0-255 pixels give about 100) from step {root.step_start}, fed to {fed} whose first layer is no "
            f"normalisation layer. That layer's pre-activations and weight gradients are about {num(rms)} times "
            "larger than on normalised data, and its updates must first undo the input's scale before they learn "
            "the task."
        )
        fix = (
            "normalise the inputs: scale pixels to 0-1 (ToTensor()) and standardise them (Normalize(mean, std)); "
            "standardise tabular features with the training set's mean and standard deviation."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"unnormalised (root-mean-square {num(event.metrics.get('input_rms', 0.0))})"

    def label(self, event: SemanticEvent) -> str:
        return f"inputs rms {num(event.metrics.get('input_rms', 0.0))}"

    def effect(self, event: SemanticEvent) -> str:
        return "unnormalised inputs"
