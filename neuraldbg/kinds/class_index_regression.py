"""Class indices regressed as numbers: a mean squared error between one output per sample and a target that
holds only a handful of integer values from 0 (:data:`FEWEST_VALUES` to :data:`MOST_VALUES` of them), while the
fit, past predicting the target's mean, still leaves at least :data:`UNEXPLAINED` of the target's variance
unexplained when the run ends.

Category labels 0..C-1 carry no order and no distance: regressing them asks the model to put class 7 between
classes 6 and 8, to map its inputs onto an arbitrary, non-monotone numbering, and to predict the mean of the
candidates when unsure, so the fit is slow, leaves much of the variance while it learns, and its rounded
predictions are poor. A classifier (one logit per class, cross-entropy)
is what such targets need. The evidence is read from the loss's autograd graph on the first backward passes (the
``MseLossBackward0`` node's saved target, profiled on the device and read at the flush: see
:mod:`neuraldbg.capture.loss_graph`) and from the loss curve (see :mod:`.loss_evidence`): the mean of its last
quarter against the target's variance (averaged over the first batches), which is the MSE of predicting the
target's mean for every sample. A loss still above that variance has not even learnt the target's mean (a run too
short, or a learning rate too low: the loss rooms' story), so how well it would fit cannot be judged.

What it cannot see: a model trained long enough to memorise the indices of its training set (the benchmark's MLP
regressing 10 class indices explains 94 % of their variance after 30 epochs, yet still classifies 28 % of the
held-out images right against the classifier's 84 %); the harm is then on held-out data only.

The same labels given to a classifier's logits, ``mse_loss(logits, labels.float().unsqueeze(1))``: the one target
per sample is broadcast across the C outputs (torch warns that the target's size differs from the input's and goes
on), so every output is pulled to the class index and the outputs cannot rank the classes. That is reported from
the shapes and the target's integers alone, whatever the loss did: the outputs fit the index well (plain torch: an
8x8-image CNN's MSE ends at 3 % of the labels' variance while its argmax is right on 23-37 % of held-out images,
four classes), and two integer values are enough there (two outputs given 0/1 labels).

Not judged: a target with a fractional value (a regression on measured values), with fewer than three values (0/1 under
MSE is a Brier score), spread over its range much less evenly than class labels are (below :data:`EVEN` of the variance
of integers spread evenly over it: counts and ratings), whose smallest value is not 0 (ratings of 1 to 5 stars: a scale,
not class indices; a recommender whose item table was left out of the optimizer fits them poorly, as class indices would
be fitted, and was told to use cross_entropy), with negative values or more than :data:`MOST_VALUES` of them (wide
counts, 0-255 pixels), a prediction of more than one value per sample (an image, a feature map), a summed MSE, and a run
whose loss curve cannot be judged (see :func:`.loss_evidence.judged`). An ordinal target that the model does fit (a
rating, a count it predicts well) explains most of its variance and stays silent.
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import num
from . import loss_evidence
from .base import LAST_RANK, Kind, RootLane, Series, run_event

KIND = FailureKind.CLASS_INDEX_REGRESSION

#: Integer values a target of class indices holds, at least (two are a binary target: a Brier score under MSE).
FEWEST_VALUES = 3
#: ... and at most, counted from its smallest to its largest value (a classifier's label set; 0-255 pixels and
#: counts spread wider).
MOST_VALUES = 32
#: The fraction of the target's variance the fit still leaves at the end of the run, at least (the real-programs
#: benchmark's MLP regressing 10 class indices: 0.62-0.65 over three seeds; a fit explaining more than half of the
#: variance is taken to be a regression that works).
UNEXPLAINED = 0.5
#: The target's variance over that of integers spread evenly over its range (``(values ** 2 - 1) / 12``), at least:
#: a classifier's labels are spread over their classes about evenly (0.9-1.0 for the benchmark's and the tests'
#: class indices, drawn from balanced classes), while counts and ratings pile up at a few values (a Poisson count of
#: 0-14 rentals an hour: 0.25; ratings of 0-5 stars: 0.57), and a count's noise leaves most of its variance to any
#: fit (the best possible MSE of a Poisson count is its mean: 0.62-0.69 of that variance).
EVEN = 0.7


class ClassIndexRegression(Kind):
    name = KIND.value
    title = "class indices regressed with MSE"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        if len(coverage.regression_target) != 4:
            return None
        if coverage.repeated_target is not None:
            return _repeated(coverage, coverage.repeated_target)
        integer, low, high, variance = coverage.regression_target
        values = high - low + 1
        # class indices start at 0 (what cross_entropy takes); integers from 1 are a scale: ratings of 1-5 stars
        if integer < 1 or low != 0 or not FEWEST_VALUES <= values <= MOST_VALUES or not variance > 0:
            return None
        if variance < EVEN * (values * values - 1) / 12:
            return None  # piled up at a few values: a count or a rating, not labels spread over their classes
        curve = loss_evidence.judged(coverage, facts.config)
        if curve is None or not UNEXPLAINED * variance <= curve.end.mean < variance:
            return None
        return run_event(
            KIND,
            curve.start.first,
            curve.end.last,
            "mse_loss",
            low=low,
            high=high,
            variance=variance,
            start=curve.start.mean,
            end=curve.end.mean,
            end_from=float(curve.end.first),
            unexplained=curve.end.mean / variance,
            limit=UNEXPLAINED,
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # after every fault of a layer, before the loss findings it explains
        return RootLane(LAST_RANK, order=0) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the program's choice of loss

    def place(self, event: SemanticEvent) -> str:
        return "the loss"

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        low, high = int(m.get("low", 0.0)), int(m.get("high", 0.0))
        outputs = int(m.get("outputs", 1.0))
        if outputs > 1:
            whose = f" (the output of '{root.detail}')" if root.detail else ""
            what = (
                f"Class indices regressed by every output: mse_loss compared each of the model's {outputs} outputs "
                f"per sample{whose} with one target per sample broadcast across them (shape (N, 1) against "
                f"(N, {outputs}); torch warns that the target size differs from the input size), and that target "
                f"holds only the integers {low} to {high}, from step {root.step_start}. Every output is pulled "
                "towards the same number, the label, so the outputs cannot rank the classes: their argmax is "
                "arbitrary however low the loss goes."
            )
            fix = (
                f"if the {outputs} outputs are one logit per class, train them with cross_entropy(outputs, labels) "
                "on the integer labels of shape (N,) (argmax to predict); if the model should predict one number "
                "per sample, give it one output."
            )
            return what, fix
        what = (
            f"Class indices regressed with MSE: the model gives one number per sample and mse_loss compares it "
            f"with a target that holds only the integers {low} to {high}. Over steps "
            f"{int(m.get('end_from', root.step_start))}-{root.step_end} the loss averaged {num(m.get('end', 0.0))}, "
            f"{num(100 * m.get('unexplained', 0.0))}% of the target's variance {num(m.get('variance', 0.0))} (the "
            "loss of predicting its mean for every sample): the fit explains less than half of it. If these "
            "integers are categories, they have no order and no distance, and a regression can only average "
            "them."
        )
        fix = (
            f"treat them as classes: give the last layer one output per class ({high + 1}) and train with "
            "cross_entropy on the integer labels (argmax to predict); keep MSE only for targets whose values are "
            "quantities."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        m = event.metrics
        outputs = int(m.get("outputs", 1.0))
        across = f", broadcast across {outputs} outputs" if outputs > 1 else ""
        return f"MSE on integer targets {int(m.get('low', 0.0))}-{int(m.get('high', 0.0))}{across}"

    def label(self, event: SemanticEvent) -> str:
        outputs = int(event.metrics.get("outputs", 1.0))
        if outputs > 1:
            return f"MSE on class indices, each of {outputs} outputs"
        return f"MSE on class indices: {num(100 * event.metrics.get('unexplained', 0.0))}% unexplained"

    def effect(self, event: SemanticEvent) -> str:
        return "class indices regressed with MSE"


def _repeated(coverage: Coverage, repeated: tuple[int, str, int]) -> SemanticEvent | None:
    """The labels broadcast across a prediction's outputs: a target of integers 0 to C - 1 for C outputs, one per
    label (two outputs given 0/1 labels cannot rank them either), C at most :data:`MOST_VALUES`, seen on the first
    backward passes (its profile read at a flush). Heads of an ensemble, or a sequence's steps, each regressing one
    integer target are not judged unless the target's values happen to number the outputs (see
    docs/limitations.md)."""
    integer, low, high, variance = coverage.regression_target
    outputs, layer, step = repeated
    if integer < 1 or low != 0 or high + 1 != outputs or not 2 <= outputs <= MOST_VALUES or not variance > 0:
        return None
    return run_event(
        KIND,
        step,
        max(step, coverage.last_step),
        layer,
        low=low,
        high=high,
        variance=variance,
        outputs=float(outputs),
    )
