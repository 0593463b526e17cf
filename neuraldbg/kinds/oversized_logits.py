"""Oversized logits at the start: a classifier whose first loss, before any update, is :data:`START_FACTOR` times
log(classes) or more, where an untrained classifier's cross-entropy is about log(classes).

A classifier starts near chance when its logits start near zero: every class equally likely, a cross-entropy of
log(classes) (the real-programs benchmark's healthy classifiers start at 0.99-1.07 of it, its language models and
Hugging Face models included). A mean cross-entropy several times larger is only reached by logits far from unit
scale that pick classes at random with confidence: the layers multiply the signal at initialisation, each by its
weights' scale times the fan-in it sums over (``N(0, 1)`` weights in a layer with 1152 inputs multiply by ~34),
or by an operand it multiplies with that is not normalised (a graph convolution's ``A + I`` sums a node's
neighbours where ``D^-1/2 (A + I) D^-1/2`` averages them). The softmax is saturated from the first step, most of
the batch's gradient comes from the confidently wrong samples, and the first epochs are spent shrinking the logits
back to a usable scale (a CNN with ``N(0, 1)`` weights: first loss 281 log(10), still 10 log(10) at the end).

Judged on the first recorded loss, the one before any update (the loss is recorded from the backward pass when the loop
does not hand it over; a learning rate far too high throws the next ones up, which says nothing of the initialisation),
only for a loss that normalises logits itself and averages over its samples (read from the loss's autograd graph,
:mod:`neuraldbg.capture.loss_graph`: a summed cross-entropy starts at samples x log(classes) whatever the logits; a
label-smoothed mean starts at log(classes) too), a loss that chooses among two or more classes (its rows' own options,
not the width of a feature tensor the model returns before its logits: see :func:`.loss_evidence.chance_level`), and a
run the debugger met at its start (a model met mid-training may be anywhere) whose first step a GradScaler did not skip,
and whose first recorded loss is one backward pass's (LBFGS evaluating its closure four times without ``zero_grad`` adds
the four losses up: 8.8 = 2.35 + 2.34 + 2.15 + 1.96 for 10 classes, an untrained classifier's each).
Logits that are cosine similarities times a scale (ArcFace and CosFace heads with s = 30 to 64 and an angular
margin against the labels' class, CLIP's 1/0.07, read from the loss's graph) are not judged: they are bounded by a
scale the user chose, whatever the initialisation, and a margin raises the first loss by design (ArcFace on
10 classes, s = 30, m = 0.5: 11 log(10), then to 0.001 in 150 steps). The explanation shows the output scale of
the layers with parameters at the first observed step, where the signal grows.
"""

from __future__ import annotations

import math

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, num
from .base import LAST_RANK, Kind, RootLane, Series, run_event
from .loss_evidence import chance_level

KIND = FailureKind.OVERSIZED_LOGITS

#: A first mean cross-entropy at least this many times log(classes) comes from logits far from unit scale (healthy
#: classifiers of the real-programs benchmark: at most 1.07; ``N(0, 1)`` weights in a CNN: 281; a graph convolution
#: over an unnormalised adjacency: 10.5; raw 0-255 pixels into an MLP: 6.4).
START_FACTOR = 3.0
#: Layers shown in the explanation, at most (the largest outputs).
_SHOWN = 6


class OversizedLogits(Kind):
    name = KIND.value
    title = "oversized logits at the start"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        # the classes the loss chose among: the output's last dimension, unless the loss's own rows hold another
        # number of options (a model returning its 2-d features before its logits, a prototypical net's distances to
        # its prototypes) or its labels index another dimension (see loss_evidence.chance_level)
        classes, chance = chance_level(coverage)
        losses = coverage.losses
        if not (coverage.classifier_loss and coverage.classifier_mean and classes > 1 and chance and losses.first):
            return None
        if coverage.classifier_cosine:
            return None  # cosine similarities times a scale: their size is the scale the user chose (ArcFace's 30)
        if coverage.nll_dim >= 0:
            return None  # a log_softmax over another dimension (the batch's): the first loss is about log of its
            # size whatever the logits (missing_log_softmax names that fault)
        step, start = losses.first[0]
        if coverage.warm_start or 0 <= losses.first_nonfinite < step:
            return None  # met mid-training, or the first loss was not finite: no loss before any update is known
        if coverage.scaler is not None and step in coverage.scaler.first_skipped:
            return None  # a GradScaler skipped that step: its overflowing scaled loss is no reading of the logits
        if coverage.first_loss_terms > 1:
            return None  # the losses of several backward passes added up (a closure evaluated again without
            # zero_grad, micro-batches): no one forward pass's level
        if not start >= START_FACTOR * chance:
            return None
        return run_event(
            KIND,
            step,
            step,
            coverage.classifier_loss,
            start=start,
            chance=chance,
            classes=float(classes),
            factor=start / chance,
            limit=START_FACTOR,
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # after every fault of a layer, after unnormalised inputs (which explain large logits themselves), before
        # the loss findings it explains
        return RootLane(LAST_RANK, order=1) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # present before any update

    def place(self, event: SemanticEvent) -> str:
        return "the model's output"

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        classes = int(m.get("classes", 0.0))
        what = (
            f"Oversized logits at the start: the first loss, before any update, is {num(m.get('start', 0.0))}, "
            f"{num(m.get('factor', 0.0))} times log({classes}) = {num(m.get('chance', 0.0))}, the cross-entropy of an "
            f"untrained classifier whose logits start near zero ({root.detail or 'cross-entropy'}, averaged over the "
            "samples). Only logits far from unit scale give that: the model picks classes at random with "
            "confidence, its softmax is saturated, and training first spends its steps shrinking the logits."
        )
        grown = _growth(topo, series, root.step_start)
        if grown:
            what += f" Output root-mean-square of the layers with parameters at step {root.step_start}: {grown}."
        fix = (
            "initialise the weights with a variance of about 1/fan-in (PyTorch's default init, "
            "nn.init.kaiming_normal_ or xavier_normal_) rather than a fixed std such as N(0, 1); normalise what a "
            "layer multiplies its input by (a graph adjacency as D^-1/2 (A + I) D^-1/2, inputs to unit scale); or "
            "scale the last layer's initial weights down so that the first loss is near log(classes)."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        m = event.metrics
        factor, classes = num(m.get("factor", 0.0)), count(m.get("classes", 0.0))
        return f"first loss {num(m.get('start', 0.0))} ({factor} x log {classes})"

    def label(self, event: SemanticEvent) -> str:
        return f"first loss {num(event.metrics.get('factor', 0.0))}x chance"

    def effect(self, event: SemanticEvent) -> str:
        return "oversized logits at the start"


def _growth(topo: Topology, series: Series, step: int) -> str:
    """The output rms of the layers with parameters at ``step`` in forward order, the largest :data:`_SHOWN`."""
    found: list[tuple[str, float]] = []
    for layer in topo.order:
        value = next((v for s, v in series("output_rms", layer) if s == step), None)
        if value is not None and math.isfinite(value):
            found.append((layer, value))
    if len(found) > _SHOWN:
        keep = {layer for layer, _ in sorted(found, key=lambda lv: -lv[1])[:_SHOWN]}
        found = [(layer, v) for layer, v in found if layer in keep]
    return ", ".join(f"'{layer}' {num(v)}" for layer, v in found)
