"""Oversized updates: every optimizer step rewrites the weights, the sign of a learning rate far too high.

**Updates as large as the weights** (:class:`UpdateSurgeDetector`): on fully observed steps, the median over the
model's layers of ||dW|| / ||W|| above ``exploding_update_ratio`` (healthy training moves weights by ~0.1 % per
step). What changes a layer by half its size every step is the learning rate, whatever the gradients do: under
Adam-like optimizers an update is about the learning rate per element however large or small the gradient, so a
learning rate far too high shows here while the gradients stay modest.

The weight norm a step is measured against is the layer's norm before the step: oversized updates inflate the
weights they are measured against (Adam at a learning rate of 5 moves every element of a layer initialised at 0.02
by ~5 at its first step: 250x its weights, and 1x the weights after the step).

Large updates are not oversized when they make the fit better: a small model starting far from its solution (a
linear regression from PyTorch's init, a tiny net under Adam at 0.1) moves its weights by more than their own size
in its first steps, and its loss falls all the way; pytorch/examples' word language model trains with plain SGD at
a learning rate of 20 (clipped to 0.25), moving its layers by 10-40 % a step while its loss falls, noisily. So a
run of updates above the ratio counts only once the fit got worse while they lasted (the loss the loop reports, or
else the gradient of the loss with respect to the model's output, risen beyond its own noise over where it stood
just before them): a learning rate 100x too high overshoots, and the loss rises (1.4 -> 377 for a tiny BERT at 5,
4.2 -> 6.7 for a tiny GPT-2 at 0.1, 3.8 -> 4.7 for a transformer at 0.05) before it settles at chance. Until then
its findings are provisional (they date the event, but do not confirm it); the rise, judged over the run's own
steps, then confirms the whole run however few steps are left of it (a tiny ViT under AdamW at 0.1: updates of
95 %, 49 %, 30 %, 20 %, 15 % and 12 % of the weights over its first six steps while the loss went 1.6, 2.0, 4.6,
1.9, 2.7, 1.8; the rise is clear at the fifth, two steps before the updates fall below the ratio). Updates large
from the run's first step have only that step's loss to say where the fit stood, and one batch's loss says nothing
of its own noise: the rise over it must be a tenth of it or more. Small models at the learning rate that trains
them best move their weights by 15 % a step at first, and their next batch losses can come out a few percent above
the first (a logistic regression under SGD at 0.1: 0.762, then 0.790 and 0.783; a recommender under Adagrad at
0.1: log 2, then 0.701 on average), while a learning rate 100x too high throws the loss up by 17 % or more.

The surge is evidence (an event without a kind of its own): the reasoning attaches it to the failure it sets off
(units dying, saturating, gradients exploding, values overflowing after it: :mod:`neuraldbg.reasoning.engine`,
"one learning rate, one fault"), whose explanation then names the learning rate. Surges that set nothing off are a
hypothesis of this kind, and so are the failures of a layer that began long after surges at the learning rate still
in force then had come and gone (:attr:`~neuraldbg.kinds.Kind.surge_victim`: units dying, saturating) and the loss
findings that began no earlier than the surges (the loss they spoilt). Root: after every other fault (rank 9).
Config: ``exploding_update_ratio``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from ..capture.coverage import Coverage, RunFacts
from ..config import DebugConfig
from ..detectors.base import Detector, Finding, Observation, StepView, strength
from ..events import EventType, FailureKind, SemanticEvent
from ..health import GradientHealth, UpdateHealth, is_state
from ..reasoning.rules import is_update_surge
from ..reasoning.topology import Topology
from ..text import num, pct, quoted
from . import loss_evidence
from .base import Check, Kind, RootLane, Series

KIND = FailureKind.OVERSIZED_UPDATES


class UpdateSurgeDetector(Detector):
    """Oversized updates: the median ||dW||/||W|| above ``exploding_update_ratio`` (evidence), each layer's update
    measured against its weights before the step, while the fit gets worse: see the module docstring."""

    name = "update_surge"
    track = "update"
    event_type = EventType.UPDATE
    every_step = False

    def __init__(self) -> None:
        self._start: tuple[str, float] | None = None  # the fit's signal when the current large updates began
        self._before: list[float] = []  # ... the calm readings that say so (none: their first reading does)
        self._since: list[float] = []  # ... and at each of their steps after the first
        self._worse = False  # ... which made it worse
        self._calm: dict[str, deque[float]] = {  # the last readings of steps without large updates
            name: deque(maxlen=_CALM_READINGS) for name in ("loss", "loss_gradient")
        }
        self._first: dict[str, bool] = {}  # each layer: whether its weights were zero when first observed
        self._peak: tuple[float, int] | None = None  # the largest median of the current run of large updates, its step

    def observe(self, view: StepView) -> Observation | None:
        census = view.updates
        if census is None:
            return None
        obs = Observation()
        if census.at_lr_zero:
            obs.saw(self.event_type, "")  # nothing moved: no surge (a stall, the stalled detector's)
            return obs
        layers, ratios = census.layers, census.ratios
        if not ratios:  # every gradient exactly zero: the weights the optimizer's momentum still moves
            layers, ratios = _carried(view, census.layer_lrs)
        if not (ratios and (census.moving or census.stepped_ever)):
            return obs
        obs.saw(self.event_type, "")
        median, top = self._ratios(view, layers, ratios)
        limit = view.ctx.config.exploding_update_ratio
        if median <= limit:
            self._start, self._worse, self._peak = None, False, None
            self._calm_step(view)
            return obs
        worse = self._getting_worse(view)
        if self._peak is None or median > self._peak[0]:
            self._peak = (median, view.data.step)
        metrics = census.ratio_metrics() if census.ratios else ({"lr": census.lr} if census.lr is not None else {})
        metrics["median_update_ratio"] = median
        metrics["peak_update_ratio"], metrics["peak_update_step"] = self._peak[0], float(self._peak[1])
        metrics["max_update_ratio"] = max(top, metrics.get("max_update_ratio", top))
        grads = [g.norm for g in view.layer_gradients.values() if math.isfinite(g.norm)]
        if grads:
            metrics["max_layer_grad_norm"] = max(grads)
        if worse and self._start is not None and self._start[0] and self._since:
            metrics[f"{self._start[0]}_before"] = self._start[1]
            metrics[f"{self._start[0]}_during"] = statistics.fmean(self._since)
        s = strength(median, limit, decades=2, above=True)
        # a rise read over the run's own steps proves the whole run; a run judged by its updates alone (no reading of
        # the fit) still needs the persistence every state needs
        proved = worse and self._start is not None and bool(self._start[0])
        finding = Finding(
            self.event_type, None, "", UpdateHealth.EXPLODING, metrics, s, provisional=not worse, confirms_run=proved
        )
        obs.findings.append(finding)
        return obs

    def _ratios(self, view: StepView, layers: list[str], fallback: list[float]) -> tuple[float, float]:
        """(median, largest) of each layer's ||dW|| over its norm before this step. Layers whose weights were all
        zero when first observed (a parameter initialised to zeros that a layer of its own holds: a tied decoder's
        bias, a position embedding, a layer-scale gate) are left out while another layer is there: they grow from
        nothing, so under Adam-like optimizers each step moves them by 1/t of their size at step t whatever the
        learning rate (a tied autoencoder at Adam 5e-3: 1, 0.5, 0.33, ... while its encoder moves by 0.05)."""
        updates = view.layer_updates
        for layer in layers:
            u = updates[layer]
            if layer not in self._first and math.isfinite(u.before):
                self._first[layer] = u.before == 0
        grown = [layer for layer in layers if not self._first.get(layer, False)]
        ratios: list[float] = []
        for layer in grown:
            u = updates[layer]
            before = u.before if math.isfinite(u.before) and u.before > 0 else u.weight
            ratio = u.delta / before if before > 0 else u.ratio
            if math.isfinite(ratio):
                ratios.append(ratio)
        ratios = sorted(ratios or fallback)
        middle = len(ratios) // 2
        median = ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2
        return median, ratios[-1]

    def _getting_worse(self, view: StepView) -> bool:
        """Whether the fit got worse while these large updates lasted: the loss (when the loop reports it), else the
        gradient of the loss with respect to the output, averaged over their steps after the first, above where it
        stood before them by more than twice the standard error of that difference (a batch's loss varies from step
        to step; a loss that rises is pushed up). A reading that stays positive is compared on a log scale, where a
        loss moves by factors: one step that throws the loss tenfold up, followed by steps that bring it back
        towards where it was, is a fit made worse, not noise that hides a rise (an MLP under Adam at 0.1: 2.3, then
        24.8, 6.9, 3.9, 3.2).

        Where it stood: the median of the last ``_CALM_READINGS`` calm readings before them when there are at least
        ``_CALM_LEAST``, else the reading at their first step (which that step's update has not changed yet). The
        last ones, not all since the run began: after a long fall, a learning rate raised late throws the loss up
        and still below the mean of the whole run (an MLP under Adam at 0.01 raised to 0.5 at step 150: 1.2 over
        the ten steps before, 6.9 over the next ten, 35 over the next sixty against 1.4 for the twin that keeps its
        rate, while its calm readings since the start, from 122, averaged 30). Their median: one extreme batch among
        them does not lift where the fit stood. The standard error counts the noise of those calm readings beside
        the spread of the readings since: two readings during large updates can lie close together by chance, and
        their spread alone then takes the loss for one without noise (pytorch/examples' word language model, SGD at
        lr 20, large updates by design and a loss of 3.7-4.0 from batch to batch: 3.94 and 3.88 during them were
        a rise over 3.84, the mean of the last four calm readings, by their own spread alone).

        A rise of less than ``_RISE`` of where it stood is none, however steady the readings (a loss that hardly
        moves from batch to batch has next to no standard error), and of less than ``_ONE_READING_RISE`` where that
        is a single reading, whose noise nothing measures. Once worse, the run of large updates counts to its end. A
        run without either reading is judged by the updates alone."""
        readings = self._readings(view)
        if self._start is None:
            name = next(iter(readings), None)
            if name is None:
                self._start = ("", math.nan)
                return True
            before = list(self._calm[name]) if len(self._calm[name]) >= _CALM_LEAST else []
            reference = statistics.median(before) if before else readings[name]
            self._start, self._before, self._since = (name, reference), before, []
            return False
        name, reference = self._start
        if not name:
            return True
        value = readings.get(name)
        if value is not None:
            self._since.append(value)
        since, before = self._since, self._before
        if not self._worse and len(since) >= 2:
            share = _RISE if before else _ONE_READING_RISE  # one reading says nothing of its own noise
            if reference > 0 and min(since) > 0 and min(before, default=1.0) > 0:  # moves by factors: log scale
                since, before, reference = _logs(since), _logs(before), math.log(reference)
                least = math.log1p(share)
            else:
                least = share * abs(reference)
            variance = statistics.variance(since) / len(since)  # the error of the mean of the readings since ...
            if len(before) >= 2:
                variance += statistics.variance(before) / len(before)  # ... and of where it stood before them
            self._worse = statistics.fmean(since) - reference > max(2 * math.sqrt(variance), least)
        return self._worse

    def _readings(self, view: StepView) -> dict[str, float]:
        data = view.data
        signals = (("loss", data.loss), ("loss_gradient", data.target_grad))
        return {name: v for name, v in signals if v is not None and not math.isnan(v)}

    def _calm_step(self, view: StepView) -> None:
        """A step without large updates: its readings are where the fit stands."""
        for name, value in self._readings(view).items():
            self._calm[name].append(value)


def _carried(view: StepView, stepped: dict[str, float]) -> tuple[list[str], list[float]]:
    """The layers whose gradient is exactly zero at this step and whose weights moved all the same, stepped with a
    positive learning rate (``stepped``: each layer's), with their update ratios: what moves them is the
    optimizer's momentum, at its learning rate (Adam after one step that saturated every unit keeps moving the
    weights by a fraction of the learning rate per element for tens of steps). The census leaves such layers out
    (no gradient, no update of their own); a run of large updates is followed through them. Weights written by the
    loop itself under a learning rate of 0 are not the optimizer's doing."""
    grads = view.layer_gradients
    layers = [
        layer
        for layer, u in view.layer_updates.items()
        if layer in grads
        and grads[layer].exact_zero
        and stepped.get(layer, 0.0) > 0
        and u.delta > 0
        and u.weight > 0
        and math.isfinite(u.ratio)
    ]
    return layers, [view.layer_updates[layer].ratio for layer in layers]


def _logs(values: list[float]) -> list[float]:
    return [math.log(v) for v in values]


#: A rise of the fit's reading by less than this share of where it stood is no rise, however steady: a loss that
#: barely moves from batch to batch (a skip-gram model's first losses, near 6 log 2 from its zero-initialised output
#: vectors) rose by 0.3 % under bfloat16 autocast, whose 8-bit mantissa rounds by 0.4 %.
_RISE = 0.01
#: A rise by less than this share of where the fit stood is no rise either when that is a single reading (the large
#: updates began at the run's first step, or with too few calm readings before them): one batch's loss says nothing
#: of its own noise, and the spread of the few readings since says little (two can lie close together by chance).
#: Healthy runs at their best learning rate rose that way by a few percent over their first reading, within a
#: batch's noise: a logistic regression under SGD at 0.1, 0.762 then 0.790 and 0.783 (3 %, its first six batch
#: losses spread by 8 %), a matrix-factorisation recommender under Adagrad at 0.1, 0.693 then 0.701 on average
#: (1.2 %). A learning rate far too high throws the loss up by more from its first steps: by 17 % for a transformer
#: under Adam at 0.05 (3.78, then 4.16 and 4.72), the least among those of the real-programs benchmark, and by
#: factors for the others.
_ONE_READING_RISE = 0.1
#: The last calm readings before a run of large updates whose median says where the fit stood ...
_CALM_READINGS = 8
#: ... when there are at least this many (fewer: the run's first reading does).
_CALM_LEAST = 4
#: A loss whose last quarter averages at most this share of where it stood before large updates trained on
#: after them: they are undone (see :meth:`OversizedUpdates.undone`).
UNDONE_FALL = 0.1


class OversizedUpdates(Kind):
    name = KIND.value
    states = ()
    evidence = (UpdateHealth.EXPLODING,)
    confirmed_by_escalation = (UpdateHealth.EXPLODING,)
    check = Check("assert_healthy", "oversized updates")

    def detectors(self, config: DebugConfig) -> list[Detector]:
        return [UpdateSurgeDetector()]

    def undone(self, event: SemanticEvent, coverage: Coverage, facts: RunFacts) -> bool:
        """Large updates whose rise of the loss the rest of the run more than undid: the mean loss of the run's
        last quarter (:func:`.loss_evidence.read`), wholly after them, at most ``UNDONE_FALL`` of where it stood
        before them, and below it by more than the loss's batch-to-batch spread. A learning rate that overshot
        early, on a rare extreme batch, and then trained (pytorch/examples' polynomial regression under
        hand-written SGD at 0.1: the loss rose from 8 to 16 over steps 10-16, then fell to 0.55, 0.07 of 8, with a
        spread of a few units; at a 10x lower rate it ends at 8), not one too high: that one leaves the loss at
        chance, climbing, or a little below where it stood (learning rates 100x too high in the real-programs
        benchmark: 0.66-0.93 of it, for a transformer, a tiny GPT-2 and a ConvNeXt), or throws it so far up that
        its spread dwarfs where it stood (a GRU forecaster at Adam 0.1: 0.28, then 7.4, a spread of 0.62, though
        it ends at 0.011)."""
        before = event.metrics.get("loss_before")
        if before is None or not is_update_surge(event):
            return False  # confirmed by the gradient of the loss, or by the updates alone: not judged on the loss
        curve = loss_evidence.read(coverage, facts.config)
        if curve is None or curve.end.first <= event.step_end:
            return False
        return loss_evidence.fell_below(curve, before, UNDONE_FALL)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # updates as large as the weights that caused nothing else: a learning rate far too high
        return RootLane(9) if is_update_surge(event) else None

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        lr = root.metrics.get("lr")
        with_lr = f" with learning rate {num(lr)}" if lr is not None else ""
        m = root.metrics
        median = m.get("median_update_ratio", math.nan)
        peak = m.get("peak_update_ratio", math.nan)
        # the step the event reports may come after the largest updates of the run (its first solid step)
        largest = (
            f", up to {_share(peak)} at step {int(m['peak_update_step'])}"
            if peak > _PEAK_APART * median and "peak_update_step" in m
            else ""
        )
        what = (
            f"Oversized updates from step {root.step_start}{with_lr}: each step moves the weights by "
            f"{_share(median)} (the median ||dW||/||W|| over the layers{largest}; healthy "
            "training moves them by about 0.1% of their size per step)"
        )
        for signal, words in (("loss", "the loss"), ("loss_gradient", "the gradient of the loss")):
            if f"{signal}_before" in m:
                what += (
                    f", and the fit got worse meanwhile: {words} rose from {num(m[f'{signal}_before'])} to "
                    f"{num(m[f'{signal}_during'])} on average"
                )
                break
        what += "."
        exploding = [e for e in rest if e.kind is not None and is_state(e.to_state, GradientHealth.EXPLODING)]
        if exploding:
            layers = sorted({e.layer for e in exploding}, key=topo.position)
            what += f" Gradients are large too in {quoted(layers)}."
        elif root.metrics.get("max_layer_grad_norm") is not None:
            what += f" The gradients stay modest (largest {num(root.metrics['max_layer_grad_norm'])})."
        return what, lower_lr(lr)

    def describe(self, event: SemanticEvent) -> str:
        m = event.metrics
        lr = m.get("lr")
        with_lr = f", learning rate {num(lr)}" if lr is not None else ""
        updates = "" if not event.layer and event.param is None else "updates "  # read after "the model's updates"
        return f"{updates}oversized (median update/weight ratio {num(m.get('median_update_ratio', math.nan))}{with_lr})"

    def label(self, event: SemanticEvent) -> str:
        return f"oversized updates: {num(event.metrics.get('median_update_ratio', math.nan))}"

    def effect(self, event: SemanticEvent) -> str:
        return "oversized updates"


#: A run's largest median update is named beside the one its event reports when it is this many times larger.
_PEAK_APART = 1.5


def _share(ratio: float) -> str:
    """'18% of their size', '12x their size'."""
    return f"{num(ratio)}x their size" if ratio >= 1 else f"{pct(ratio)} of their size"


def lower_lr(lr: float | None) -> str:
    """The fix for a learning rate far too high."""
    now = f" (now {num(lr)})" if lr is not None else ""
    return (
        f"lower the learning rate{now}, e.g. 10x smaller, or warm it up over the first steps; with Adam-like "
        "optimizers each step moves every weight by about the learning rate, whatever the gradients are."
    )
