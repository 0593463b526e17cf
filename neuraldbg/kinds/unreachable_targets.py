"""Unreachable targets: a loss by value (``mse_loss``, ``smooth_l1_loss``, ``huber_loss``) compares targets with the
output of an activation whose range does not hold them: a ReLU or softplus before standardised targets (half of them
negative), a sigmoid before targets outside [0, 1], a tanh before targets outside [-1, 1]. The targets out of range
can never be reached: the loss cannot fall below their squared distance to the range, and the units pushed against
a ReLU's floor get no gradient at all.

Read from the loss's autograd graph and one profile of the target on the first backward passes that reach the model
(see :mod:`neuraldbg.capture.loss_graph`): the loss node's prediction came from such an activation (looking through
views), and the target it saved, read on the device before the backward pass frees it, has at least :data:`SHARE`
of its elements out of the activation's range, whose squared distance to the range (the least mean squared error
the output can reach) is at least :data:`FLOOR` of the target's variance. Targets on the range's bounds (0/1
labels under a sigmoid) are within reach. A loss between two bounded outputs (a student's and a teacher's features)
never has its targets out of range.

The same fault under a binary cross-entropy (``binary_cross_entropy_with_logits``, ``BCELoss``): its probabilities
lie in [0, 1], and a target outside (labels in {-1, 1}, as a margin loss takes them) makes the loss unbounded below.
Plain torch, an MLP given {-1, 1} labels under ``BCEWithLogitsLoss``: the loss fell from 0.68 to -1787, negative
on 363 of 376 steps, its logits reached 29,038, and held-out accuracy was 0.71 against 0.84 with {0, 1} labels.
Read from the same targets' profile the chance level of a binary cross-entropy comes from (see
:func:`~neuraldbg.kinds.loss_evidence.target_chance`: a loss that is the binary cross-entropy itself, averaged):
at least :data:`SHARE` as many values outside [0, 1] as samples. Soft labels (label smoothing) stay inside.

The same fault between two models: a model given another model's output on some training passes (a discriminator
given a generator's images) and data without a graph on others (the real images). When that output came from a
bounded activation (:func:`~neuraldbg.capture.loss_graph.bounded_node`) and the data has at least :data:`SHARE`
of its elements out of its range, at least :data:`FLOOR` of its variance away, on at least :data:`DATA_STEPS`
fully observed steps and half of those profiled, the source cannot produce what it is trained to imitate: a
generator ending in a sigmoid for images normalised to [-1, 1] never makes a pixel below 0, and the discriminator
tells its images from the real ones by range alone. The event names the layer whose output the source is when it
is watched (both models in one), none otherwise (the discriminator watched alone).
"""

from __future__ import annotations

import math

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, num
from .base import Kind, RootLane, Series, layer_event, run_event

KIND = FailureKind.UNREACHABLE_TARGETS

#: The share of target elements out of the output's range, at least: a handful of outliers is no design fault.
SHARE = 0.05
#: The least mean squared error the range allows, at least this share of the target's variance: what the model
#: cannot learn is a real part of what there is to learn.
FLOOR = 0.05
#: Fully observed steps whose data lies out of a bounded source's range, at least (one odd batch is not the data).
DATA_STEPS = 3


class UnreachableTargets(Kind):
    name = KIND.value
    title = "targets out of the output's range"
    run_level = True  # about the program's loss (its event names the layer whose output is bounded)

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        bounded, profile = coverage.bounded_output, coverage.target_range
        if bounded is None or len(profile) != 3:
            return _binary_out_of_range(coverage) or _data_out_of_reach(coverage)
        share, floor, variance = profile
        if not (share >= SHARE and floor >= FLOOR * variance and floor > 0):
            return None
        activation, low, high, layer = bounded
        step = coverage.target_range_step
        metrics = {"share": share, "floor": floor, "variance": variance, "low": low, "high": high}
        return layer_event(KIND, layer, step, coverage.last_step, metrics, activation)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a program's structure, exact from its first step: beside the activation before a loss
        return RootLane(3.5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the program computes its loss this way from the first step

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        activation = root.detail or "an activation"
        if m.get("source"):
            return _explain_source(root, activation)
        if m.get("binary"):
            return _explain_binary(root)
        where = f"the output of '{root.layer}'" if root.layer else "the model's output"
        what = (
            f"Targets out of the output's range: from step {root.step_start}, {where} passes through a "
            f"{activation}, whose values lie in {_range(m)}, before a loss by value, and "
            f"{num(100 * m.get('share', 0.0))}% of the targets lie outside that range. Those cannot be reached: the "
            f"mean squared error cannot fall below {num(m.get('floor', 0.0))} "
            f"({num(100 * m.get('floor', 0.0) / max(m.get('variance', 0.0), 1e-12))}% of the targets' variance)"
        )
        what += (
            ", and the units pushed below the ReLU's floor get no gradient at all."
            if activation == "ReLU"
            else ", and the gradient of those outputs shrinks as they approach the bound."
        )
        fix = (
            f"remove the {activation} from the model's output (a linear output reaches every target), or bring the "
            f"targets into its range ({_range(root.metrics)}) and back when reading predictions."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        share = num(100 * event.metrics.get("share", 0.0))
        if event.metrics.get("binary"):
            return f"binary cross-entropy targets out of [0, 1] ({count(event.metrics.get('outside', 0.0))} values)"
        if event.metrics.get("source"):
            return f"{share}% of the data out of the range {_range(event.metrics)} of the {event.detail} imitating it"
        return f"{share}% of the targets out of the {event.detail or 'output'}'s range {_range(event.metrics)}"

    def label(self, event: SemanticEvent) -> str:
        if event.metrics.get("binary"):
            return "targets out of [0, 1]"
        if event.metrics.get("source"):
            return f"data out of the input {event.detail or 'activation'}'s range"
        return f"targets out of the {event.detail or 'output'}'s range"

    def effect(self, event: SemanticEvent) -> str:
        return "targets out of reach"


def _range(metrics: dict[str, float]) -> str:
    low, high = metrics.get("low", 0.0), metrics.get("high", math.inf)
    return f"[{num(low)}, inf)" if math.isinf(high) else f"[{num(low)}, {num(high)}]"


def _binary_out_of_range(coverage: Coverage) -> SemanticEvent | None:
    """The finding under a binary cross-entropy (see the module's doc), or None: at least :data:`SHARE` as many of its
    targets outside [0, 1] as the first backward passes read samples."""
    found = coverage.target_baseline
    if coverage.baseline_kind != "bce" or len(found) != 5:
        return None
    samples, outside = found[2], found[3]
    if not (samples > 0 and outside >= SHARE * samples):
        return None
    metrics = {"outside": outside, "samples": samples, "low": 0.0, "high": 1.0, "binary": 1.0}
    return run_event(KIND, 0, max(0, coverage.last_step), "", **metrics)


def _explain_binary(root: SemanticEvent) -> tuple[str, str]:
    m = root.metrics
    what = (
        f"Targets out of the output's range: the loss is a binary cross-entropy, and {count(m.get('outside', 0.0))} "
        f"of the targets of its first backward passes ({count(m.get('samples', 0.0))} samples) lie outside [0, 1], "
        "the range of the probabilities it compares them with (labels in {-1, 1}?). Such a target makes the loss "
        "unbounded below: it falls below zero without end while the logits grow, and no longer says how well the "
        "model classifies."
    )
    fix = (
        "give the binary cross-entropy targets in [0, 1]: (y + 1) / 2 for labels in {-1, 1}; or keep {-1, 1} "
        "labels with a loss made for them (nn.SoftMarginLoss, a hinge loss)."
    )
    return what, fix


def _data_out_of_reach(coverage: Coverage) -> SemanticEvent | None:
    """The finding between two models (see the module's doc), or None."""
    if coverage.bounded_input is None or not coverage.input_ranges:
        return None
    out = [r for r in coverage.input_ranges if r[1] >= SHARE and r[2] >= FLOOR * r[3] and r[2] > 0]
    if len(out) < DATA_STEPS or 2 * len(out) < len(coverage.input_ranges):
        return None
    _, share, floor, variance = sorted(out, key=lambda r: r[1])[len(out) // 2]  # the median step's data
    activation, low, high, layer, elsewhere = coverage.bounded_input
    metrics = {"share": share, "floor": floor, "variance": variance, "low": low, "high": high, "source": 1.0}
    metrics["elsewhere"] = float(elsewhere)
    metrics["steps"] = float(len(out))
    return layer_event(KIND, layer, out[0][0], coverage.last_step, metrics, activation)


def _explain_source(root: SemanticEvent, activation: str) -> tuple[str, str]:
    m = root.metrics
    span = _range(m)
    if not root.layer:
        source = f"the output of a {activation} (values in {span}), another model's output such as a generator's"
    elif m.get("elsewhere"):
        source = f"the output of the {activation} at '{root.layer}' of another watched model (values in {span})"
    else:
        source = f"the output of the {activation} at '{root.layer}' (values in {span})"
    share = num(100 * m.get("share", 0.0))
    floor = m.get("floor", 0.0)
    what = (
        f"Data out of reach of the model that imitates it: from step {root.step_start}, on some training passes "
        f"layers of this model are given {source}, and on others data without a graph (the real samples), {share}% "
        f"of whose values lie outside that range (on {num(m.get('steps', 0.0))} fully observed steps). The "
        f"{activation} can never produce them: the least mean squared distance of the data to its range is "
        f"{num(floor)} ({num(100 * floor / max(m.get('variance', 0.0), 1e-12))}% of the data's variance), and the "
        "model given both can tell them apart by range alone."
    )
    maker = f"'{root.layer}'" if root.layer else "the model that makes these inputs"
    fix = (
        f"replace the {activation} at {maker} with an activation whose range holds the data (tanh for data in "
        f"[-1, 1], none for unbounded data), or scale the data into {span} (images: ToTensor() alone gives [0, 1]; "
        "Normalize((0.5,), (0.5,)) after it gives [-1, 1])."
    )
    return what, fix
