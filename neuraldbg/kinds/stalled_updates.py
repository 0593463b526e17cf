"""Stalled updates: the optimizer barely moves the weights, so the loss cannot improve.

Measured on fully observed steps (see :class:`~neuraldbg.detectors.base.UpdateCensus`): the median update/weight
ratio ||dW||/||W|| over the model's layers is below ``stalled_ratio`` (a learning rate far too small for this
model). A single layer with small updates is usually a symptom of vanishing gradients and is reported there, unless
clipping made its gradients at least ``TINY_CLIP`` times smaller than the backward pass left them while the rest of
the model trains (:meth:`StalledDetector._clipped_still`): those layers are held still by the clipping. When
nothing moves at all and the optimizers hold the parameters with learning rate 0 (a schedule that reached 0), that
is one global stall, not every parameter frozen.

A model whose fit has converged (:class:`~neuraldbg.detectors.base.FitProgress`), or whose gradients fell a
hundredfold from their first values (a stationary point: a noisy regression at its least-squares optimum keeps a
loss well above 0, but its gradients go to 0), makes small updates because it has little left to learn: that is the
fit, not a stall. Both are judged against the run's first values, so a run the debugger met mid-training (its
optimizer already held state: a resumed run, a fine-tuning script) is judged against its own observed history: its
updates stall when they fall tenfold below their first observed ratio and under ``stalled_ratio`` (a schedule that
decays to nothing while watched); updates that were that small from the first observed step on are the regime the
run was already in (late training, small gradients), which the debugger did not see begin. Small updates at a
learning rate a schedule brought down to ``DECAYED`` of the largest the run stepped with, at which they would not
be stalled, after the run trained (the loss fell to ``LOSS_FELL`` of where it began, or the update ratios added up
to more than a run too small to train adds up to, :data:`RUN_SHARE` of ``loss_trained``), are the schedule's tail,
not a stall: SGD with momentum under a CosineAnnealingLR that ends near 0 moves the weights by ~1e-7 over its last
steps, under label smoothing (whose loss has a floor, the entropy of the smoothed target, far from 0) the fit never
reads as converged, and a OneCycleLR ends at a 25e4th of its peak on a hard task whose loss fell only a sixth. A
learning rate too low from the start (it is the largest the run stepped with), and a schedule that decays before
the run trained (sized for epochs, stepped every batch), are still stalls. So is a schedule that decays early after
a partial fit: a tail is the end of a run, and one whose learning rate reached its floor (``FLOOR`` of its peak)
before :data:`EARLY_SPAN` of the run's steps and held the weights still from there to the end cut the fit short,
whatever the loss had done before (:func:`_decayed_early`; sweep L: ReduceLROnPlateau stepped on every noisy batch
took Adam from 3e-3 to a hundredth of that by step 221 of 600 and to 1e-8 at the end, after the loss had fallen to
half of its start, and the regression stopped at R^2 0.49 against 0.99 stepped per epoch). A cosine reaches that
floor after 94 % of its steps, OneCycleLR and a linear decay later still, a step decay cut tenfold at 50 % and 75 %
at 75 %, and a fit that converged before its learning rate fell is the fit, not a stall. Root: after vanishing
gradients, which stall updates by themselves under SGD. Config: ``stalled_ratio``, ``fit_gradient_drop``,
``fit_loss_drop``.

A stall of a run's first steps that ended on its own while a warm-up still raised the learning rate, or within the
optimizer's own start-up (:func:`_warming_start`), is the schedule's design, not a fault, and is dropped once the
run shows it passed: RAdam's first five steps, before its variance estimate can be rectified, are SGD-with-momentum
steps of ``lr`` times the averaged gradient (sweep G: a residual MLP under RAdam 3e-3, a linear warm-up over 30
steps and ``clip_grad_norm_`` to 0.5, one sample a step: updates of 1.9e-6 of the weights over steps 0-4, then 4e-5
and more; held-out accuracy 0.904 against 0.905 without the warm-up and 0.872 without the clipping, yet it was told
to raise the learning rate 523x). Its loss, one sample a step, was too noisy to read as having fallen, so the
updates and the learning rates say it: the stall ended, the warm-up ended at a learning rate where these updates
would not be stalled, or the learning rate never changed and the stall lasted at most :data:`STARTUP` steps. A
warm-up that never ends (its learning rate still rising at the run's last step), a peak too low, a learning rate too
low, clipping to a tiny norm under SGD and a schedule that decays early stall for good and are still found.

When clipping made the gradients at least ``TINY_CLIP`` times smaller than the backward pass left them, the whole
model's stall is the clipping's: the gradients reach the optimizer at its threshold, which sets the steps' size, and
the fix is that threshold, not the learning rate (sweep D: a CNN under SGD 0.05 with ``clip_grad_norm_`` to 1e-4,
gradients shrunk ~7,000x, updates of 1.5e-6 of the weights a step, held-out accuracy 0.25 against 0.98 clipped at
1.0, was told to raise the learning rate 660x).

An adaptive optimizer's eps far above the gradients' root-mean-square stalls the steps by itself (Adam's step is then
about lr * g / eps, SGD's at lr / eps): the fix names the eps, not the learning rate (:mod:`.optimizer_settings`; sweep
M: Adam(lr=1e-3, eps=1.0) on a small transformer, gradients' rms 0.002-0.004, held-out accuracy 0.22-0.26 against 1.00
at eps=1e-8, was told to raise the learning rate 110x). Its updates may sit at the edge of ``stalled_ratio`` (1e-5 to
2.5e-5 of the weights a step from step 0 there), which dates the steps' stall by its last stretch below it (steps
112-119); the run too small to train that joins it then says how little the whole run moved.

**A run too small to train** (:meth:`StalledUpdates.run_finding`): each step may move the weights by more than
``stalled_ratio`` and the run still stall, when its steps add up to almost nothing. Judged over the whole run from its
loss curve (:mod:`.loss_evidence`, the runs it is judged on) and the model's update/weight ratios ||dW||/||W||: the
ratios of the run's steps add up to less than :data:`RUN_SHARE` of ``loss_trained`` (the weights moved by a few
percent of their norm in all), while the loss shows that the model has not trained: it stayed at chance (log of the
classes), it is flat, or its second half still fell by :data:`STILL_FALLING` of its whole fall or more (no plateau
in sight; from a start above the chance level, of its fall below it: a regression whose bias learnt its targets' mean
of 2 in its first steps and then crawled, under SGD at a learning rate 100x too low, fell 14.7 -> 6.4 with a second
half of only a quarter of that, but 0.7 of its fall below the variance of 9.7). A learning rate far too low, or
clipping to a tiny norm under SGD, does that; a fit that converged (its loss fell a hundredfold, or its gradients
did), a run met mid-training, and a classifier met already trained
(its first losses far below chance: a trained model continued by a new optimizer at a small learning rate, whose
small steps are the fine-tuning's, not a run too small to train) are not judged. Where the steps' rule also found the
whole model stalled, the two readings of the same small updates are one hypothesis (:class:`_OneStall`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ..capture.coverage import Coverage, RunFacts
from ..config import DebugConfig
from ..detectors.base import Detector, Finding, FitProgress, Observation, StepView, UpdateCensus, strength
from ..events import EventType, FailureKind, SemanticEvent
from ..health import UpdateHealth
from ..reasoning.rules import ONSET_TOLERANCE, CausalRule
from ..reasoning.topology import Topology
from ..text import num
from . import loss_evidence, optimizer_settings
from .base import Check, Kind, RootLane, Series, held, run_event

KIND = FailureKind.STALLED_UPDATES
#: How to loosen a clipping that holds the steps still.
_CLIP_FIX = "max_norm of clip_grad_norm_ (1.0 is usual) or clip_value of clip_grad_value_; or remove the clipping."

#: A run whose update/weight ratios add up to less than this share of ``loss_trained`` moved its weights too little
#: to train (calibrated on the real-programs benchmark: healthy programs add up to 0.48-18, learning rates 50-1000x
#: too low and SGD clipped to 1e-4 to 0.017-0.024). The same share from which a loss held at chance is judged
#: whatever the updates added up to (below it, this room's story).
RUN_SHARE = loss_evidence.PINNED_MOVED
#: A loss still falling at the end: its second half fell by at least this share of its fall over the whole run (a
#: steady fall gives about 0.4; a fit nearing its plateau 0.2 or less).
STILL_FALLING = 0.3
#: A learning rate at most this share of the largest the run stepped with was brought down by a schedule.
DECAYED = 0.1
#: A learning rate at most this share of the largest it stepped with is at a schedule's floor: a cosine's last
#: steps, or a schedule that decayed early (:func:`_decayed_early`); a step decay cut tenfold twice stops there.
FLOOR = 1e-2
#: A schedule that reached its floor before this share of the run's steps, and stalled the updates from there to the
#: end, decayed early: a cosine reaches it after 94 % of its steps, a step decay cut tenfold at 50 % and 75 % at 75 %.
EARLY_SPAN = 0.5
#: The loss fell when its last observed losses average at most this share of its first ones (over :data:`LOSSES`).
LOSS_FELL = 0.75
#: Observed losses averaged at the start and at the end.
LOSSES = 8
#: A stall of at most this many steps from a fresh optimizer's first one is its start-up (RAdam's first five steps
#: are not rectified; momentum builds up over about 1 / (1 - beta) = 10 steps), which ends on its own.
STARTUP = 10


def undertrained(coverage: Coverage, config: DebugConfig) -> tuple[str, loss_evidence.Curve] | None:
    """How the loss shows that a run whose updates added up to almost nothing did not train (``"chance"``,
    ``"flat"`` or ``"falling"``), with its curve; None when it does not (see the module docstring)."""
    curve = loss_evidence.judged(coverage, config)
    if curve is None or coverage.warm_start or not curve.trained < RUN_SHARE * config.loss_trained:
        return None
    if coverage.moved_unseen and curve.trained == 0.0:
        # every update measured read zero while parameters were seen changed out of sight (``optimizer.step()``
        # after the ``with dbg:`` block or in a block of its own): the sum says nothing of how far the weights moved
        # (updates measured at all, however small, are read: a stall beside one parameter moved by hand stays)
        return None
    if loss_evidence.converged(coverage, curve) or loss_evidence.met_trained(coverage, curve):
        return None  # a fit that converged, or a classifier met already trained (fine-tuned by a new optimizer)
    if curve.at_chance:
        return "chance", curve
    if curve.verdict == "flat":
        return "flat", curve
    if coverage.policy_gradient:
        # a policy-gradient loss is a surrogate whose course says nothing of the fit (it drifts as the returns do):
        # updates that added up to almost nothing are the evidence (PPO at Adam 1e-6: 0.4 % of the weights' norm
        # in 480 steps, its surrogate drifting up from 39 to 41)
        return "surrogate", curve
    first, last = curve.second_half
    fall = curve.start.mean - curve.end.mean
    level = _chance(curve)
    if level is not None and curve.end.mean < level and (1 + curve.band) * level < curve.start.mean:
        # from a start clearly above the chance level (past its band), the fall down to it is the targets' mean (or
        # the labels' frequencies) learnt through the biases, which the smallest steps learn first: the fit is what
        # follows (a start at chance, a zero-initialised head's, is measured from where it began)
        fall = level - curve.end.mean
    if curve.verdict == "fell" and not curve.stopped and first - last >= STILL_FALLING * fall:
        return "falling", curve
    return None


def _chance(curve: loss_evidence.Curve) -> float | None:
    """The loss of a model that learned nothing from its inputs, when the curve knows it: log(classes) (not the
    labels' entropy below it: a classifier falling from log(classes) towards its labels' frequencies is already
    fitting, as a fine-tune's new head at a small learning rate does), or the level a mean squared error's or a
    binary cross-entropy's targets give."""
    if curve.chance is not None:
        return curve.chance
    if curve.baseline in ("mse", "bce") and math.isfinite(curve.target_level):
        return curve.target_level
    return None


#: The ``shape`` metric of a run too small to train.
SHAPES = {"chance": 1.0, "flat": 2.0, "falling": 3.0, "surrogate": 4.0}


class StalledDetector(Detector):
    name = "stalled"
    track = "update"
    event_type = EventType.UPDATE
    every_step = False

    def __init__(self) -> None:
        self._fit = FitProgress()
        self._first_gradient: float | None = None  # the largest layer gradient norm at the first observed step
        self._resumed = False  # the run trained before the debugger attached
        self._first_median: float | None = None  # the median update ratio at the first observed update
        self._peak_lr = 0.0  # the largest learning rate the run stepped with so far
        self._layer_peaks: dict[str, float] = {}  # ... each layer's own
        self._first_losses: list[float] = []  # the first observed losses
        self._last_losses: deque[float] = deque(maxlen=LOSSES)  # the last ones
        self._moved = 0.0  # the median update ratios of the observed steps, added up over the steps they stand for
        self._last_update_step: int | None = None
        self._floor_from: int | None = None  # the first step of the median layer's learning rate at its floor

    def _loss(self, view: StepView) -> None:
        loss = view.data.loss
        if loss is not None and math.isfinite(loss):
            if len(self._first_losses) < LOSSES:
                self._first_losses.append(loss)
            self._last_losses.append(loss)

    def _median_lr(self, census: UpdateCensus) -> tuple[float | None, float]:
        """The median layer's learning rate and the largest it stepped with so far. The median layer's, against its
        own largest: a backbone whose schedule decayed to 0 beside a head stepped at a fixed rate in a group of its
        own (SimSiam's predictor) is on a schedule's tail; a group too low from its first step beside it is not. The
        run's, for a median layer whose learning rate was not seen."""
        known = [layer for layer in census.median_layers if layer in census.layer_lrs]
        if not known:
            return census.lr, self._peak_lr
        return max(census.layer_lrs[layer] for layer in known), max(self._layer_peaks[layer] for layer in known)

    def _schedule_tail(self, median: float, lr: float | None, peak: float, limit: float, trained: float) -> bool:
        """The updates (``median``) are small because a schedule brought the learning rate down, after the run
        trained: the learning rate ``lr`` is at most ``DECAYED`` of ``peak``, the largest the run stepped with, at
        which these updates would not be stalled (an update scales with the learning rate), and the loss fell to
        ``LOSS_FELL`` of where it began or the updates so far added up to ``trained``, more than a run too small to
        train (the tail of a schedule that ends near 0, not a learning rate too low to train: that one never moves
        the weights that far). Whether that tail is the run's end, or a schedule that decayed early and cut the fit
        short, only the rest of the run says (:func:`_decayed_early`)."""
        if lr is None or not self._decayed(lr, peak) or median * peak / lr < limit:
            return False
        if self._moved >= trained:
            return True
        if not self._first_losses:
            return False
        first = sum(self._first_losses) / len(self._first_losses)
        return first > 0 and sum(self._last_losses) / len(self._last_losses) <= LOSS_FELL * first

    def _floor(self, step: int, lr: float | None, peak: float) -> None:
        """Date the learning rate's fall to its floor, ``FLOOR`` of its largest or lower (None: above it)."""
        if lr is None or not 0 < lr <= FLOOR * peak:
            self._floor_from = None
        elif self._floor_from is None:
            self._floor_from = step

    def _add_moved(self, step: int, median: float) -> None:
        """Add this observed step's median update ratio for the steps since the last observed one (full steps grow
        sparse in a long run: each stands for the steps before it)."""
        last = self._last_update_step
        if math.isfinite(median):
            self._moved += median * (1 if last is None else max(step - last, 1))
        self._last_update_step = step

    def _stationary(self, view: StepView) -> bool:
        """The model's largest layer gradient fell to ``fit_gradient_drop`` squared (1 %) of its first value: the
        fit reached a stationary point (a noisy regression at its least-squares optimum, whose loss stays well
        above 0), where small updates follow from small gradients, not from the learning rate."""
        top = max((g.norm for g in view.layer_gradients.values() if math.isfinite(g.norm)), default=0.0)
        if top <= 0:
            return False
        if self._first_gradient is None:
            self._first_gradient = top
        return top <= view.ctx.config.fit_gradient_drop**2 * self._first_gradient

    def observe(self, view: StepView) -> Observation | None:
        fitted, stationary = self._fit.converged(view), self._stationary(view)  # both record first readings
        self._resumed |= view.data.resumed
        self._loss(view)
        converged = fitted or stationary
        census = view.updates
        if census is None:
            return None
        if census.lr is not None:
            self._peak_lr = max(self._peak_lr, census.lr)
        peaks = self._layer_peaks
        for layer, lr in census.layer_lrs.items():
            if lr > peaks.get(layer, 0.0):
                peaks[layer] = lr
        obs = Observation()
        if census.at_lr_zero:
            obs.saw(self.event_type, "")
            if not converged:
                metrics = {"median_update_ratio": 0.0, "max_update_ratio": 0.0, "lr": census.lr_any}
                obs.findings.append(self._finding(metrics, 1.0))
        elif census.ratios and (census.moving or census.stepped_ever):
            obs.saw(self.event_type, "")
            limit = view.ctx.config.stalled_ratio
            if self._first_median is None:
                self._first_median = census.median
            # met mid-training: small from the first observed update on is the regime it was in, not a stall
            regime = self._resumed and census.median > 0.1 * self._first_median
            median_lr, peak = self._median_lr(census)
            self._floor(view.step, median_lr, peak)
            trained = RUN_SHARE * view.ctx.config.loss_trained
            tail = self._schedule_tail(census.median, median_lr, peak, limit, trained)
            self._add_moved(view.step, census.median)
            if census.median < limit and not converged and not regime:
                metrics = census.ratio_metrics()
                if tail:  # the run's end, unless the schedule reached its floor early (StalledUpdates.undone)
                    metrics["peak_lr"] = peak
                    if self._floor_from is not None:
                        metrics["floor_from"] = float(self._floor_from)
                clip = view.data.grad_clip_factor
                if clip is not None and clip >= loss_evidence.TINY_CLIP:
                    metrics["clip"] = clip  # the clipping shrank the steps, not the learning rate
                obs.findings.append(self._finding(metrics, strength(census.median, limit, decades=3)))
            elif census.median >= limit and not converged and not self._decayed(census.lr):
                self._clipped_still(view, census, limit, obs)
        return obs

    def _decayed(self, lr: float | None, peak: float | None = None) -> bool:
        """The learning rate is on a schedule's tail: at most ``DECAYED`` of ``peak``, by default the largest the run
        stepped with."""
        return lr is not None and 0 < lr <= DECAYED * (self._peak_lr if peak is None else peak)

    def _clipped_still(self, view: StepView, census: UpdateCensus, limit: float, obs: Observation) -> None:
        """Layers that clipping holds still while the rest of the model trains: gradients made at least
        ``TINY_CLIP`` times smaller than the backward pass left them, and updates below ``stalled_ratio`` of the
        weights. Clipping only some parameters (an encoder's ``clip_grad_norm_`` to 1e-5 under SGD: its weights
        move by 1e-7 a step, and a decoder learns to read features that never change) stalls them alone; an
        optimizer that rescales the gradient (Adam) mostly keeps the updates' size. Only the layers the update census
        counts (neither held still by their optimizer nor idle: ``frozen_parameters``' and a GAN's other network's),
        and only while some layer that clipping did not shrink so far moves: the rest of the model trains."""
        before, grads, updates = view.layer_norms_before_clip, view.layer_gradients, view.layer_updates
        still: list[tuple[str, float, float, float]] = []  # (layer, shrink, update ratio, norm before clipping)
        rest_trains = False
        for layer in dict.fromkeys(census.layers):
            obs.saw(self.event_type, layer)  # seen every step the rule runs: a stretch ends when clipping does
            g, u = grads.get(layer), updates.get(layer)
            if g is None or u is None:
                continue
            b = before.get(layer, g.norm)
            shrink = b / g.norm if g.norm > 0 and math.isfinite(b) else 1.0
            if shrink >= loss_evidence.TINY_CLIP and u.ratio < limit:
                still.append((layer, shrink, u.ratio, b))
            elif shrink < loss_evidence.TINY_CLIP and u.ratio >= limit:
                rest_trains = True
        if not rest_trains:
            return
        for layer, shrink, ratio, b in still:
            metrics = {"median_update_ratio": ratio, "clip": shrink, "grad_norm_before_clip": b}
            obs.findings.append(
                Finding(self.event_type, KIND, layer, UpdateHealth.STALLED, metrics, strength(ratio, limit, 3))
            )

    def _finding(self, metrics: dict[str, float], s: float) -> Finding:
        return Finding(self.event_type, KIND, "", UpdateHealth.STALLED, metrics, s)


@dataclass(frozen=True)
class _OneStall(CausalRule):
    """Stalls that are one fault join the first one's hypothesis: the layers held still by the same clipping (layer
    events only: the run-level finding of a run too small to train carries the run's clip factor too, and is none of
    them), and the model's stall read step by step with the run too small to train, the same small updates read
    over the whole run from the loss and their sum. That reading stands after the steps' among root causes
    (:meth:`StalledUpdates.lane`), so a learning rate too low, or a clipping threshold too small, makes one
    hypothesis with one fix."""

    def applies_to(self, cause: SemanticEvent) -> bool:
        return _held_still(cause) or _model_stall(cause)

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        if _model_stall(cause):
            return _run_stall(effect)
        return _held_still(cause) and _held_still(effect) and super().explains(cause, effect, topo)

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        # a run too small to train is read from its first judged loss, which may come before the steps' stall
        return None if _model_stall(cause) else cause.step_start - ONSET_TOLERANCE

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        if _model_stall(a) or _model_stall(b):
            return _model_stall(a) and _model_stall(b)  # each explains the one run-level finding
        return (_held_still(a) or not _held_still(b)) and super().covers(a, b, topo)


def _warming_start(event: SemanticEvent, coverage: Coverage, config: DebugConfig) -> bool:
    """The stall of a run's start-up, which ended on its own: it began at the first observed update of an optimizer
    that held no state before (not a run met mid-training), ended (not still holding at the last check), and either
    happened while a warm-up still raised the learning rate, or, at the learning rate the run then kept, lasted at
    most :data:`STARTUP` steps (the optimizer's own start-up: RAdam's first five steps, before its variance estimate
    can be rectified, are SGD-with-momentum steps of ``lr`` times the averaged gradient, far smaller than its adapted
    ones). A warm-up's stall is its design when the warm-up ended (its peak learning rate reached before the run's
    last observed step: one that never ends keeps the run's steps small), the updates would not be stalled at that
    peak (an update scales with the learning rate), and the stall lasted at most :data:`.loss_evidence.PASSED_SPAN`
    of the run's steps. Read from the updates and the learning rates, not from the loss, whose fall the noise of
    batches of one sample hides."""
    rows = coverage.training.rows
    if coverage.warm_start or event.metrics.get("ongoing") or not rows or event.step_start > rows[0].step:
        return False
    lr, ratio = event.metrics.get("lr", math.nan), event.metrics.get("median_update_ratio", 0.0)
    after = [r for r in rows if r.step > event.step_end and math.isfinite(r.lr)]
    peak = max(after, key=lambda r: r.lr, default=None)  # the first row at the largest learning rate after the stall
    if peak is None or not peak.lr > lr:
        return event.steps <= STARTUP
    span = loss_evidence.PASSED_SPAN * (coverage.last_step + 1)
    return peak.step < rows[-1].step and event.steps <= span and ratio * peak.lr / lr >= config.stalled_ratio


def _decayed_early(event: SemanticEvent, coverage: Coverage) -> bool:
    """A stall on a schedule's tail (``peak_lr``: the learning rate it came down from) that is no tail: the learning
    rate reached its floor, :data:`FLOOR` of its peak or lower (``floor_from``), before :data:`EARLY_SPAN` of the
    run's steps, and the weights stood still from there to the run's end. A schedule's tail is the end of a run;
    one that decays that far that early cut the fit short, whatever the loss had done before (sweep L:
    ReduceLROnPlateau stepped on every noisy batch halved the learning rate every ~20 steps, 3e-3 to 1e-8, at its
    floor from step ~215 of 600; the loss had fallen to half of its start, and the regression stopped at R^2 0.49
    against 0.99 for its twin stepped per epoch)."""
    floor = event.metrics.get("floor_from")
    steps = max(coverage.last_step + 1, 1)
    return floor is not None and floor < EARLY_SPAN * steps and bool(event.metrics.get("ongoing"))


def _run_stall(event: SemanticEvent) -> bool:
    """A run too small to train (see :meth:`StalledUpdates.run_finding`)."""
    return event.kind is KIND and "run_updates" in event.metrics


def _model_stall(event: SemanticEvent) -> bool:
    """The whole model's updates stalled over a stretch of steps (not some layers', not the run-level reading)."""
    return event.kind is KIND and not event.layer and event.param is None and not _run_stall(event)


def _held_still(event: SemanticEvent) -> bool:
    """A layer's stall that clipping made (see :meth:`StalledDetector._clipped_still`)."""
    return bool(event.layer) and "clip" in event.metrics and "run_updates" not in event.metrics


class StalledUpdates(Kind):
    name = KIND.value
    states = (UpdateHealth.STALLED,)
    lists_own = True  # the layers one clipping holds still (_explain_clipped)
    check = Check("assert_parameters_update", "parameters do not update")

    def detectors(self, config: DebugConfig) -> list[Detector]:
        return [StalledDetector()]

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        found = undertrained(coverage, facts.config)
        if found is None:
            return None
        shape, curve = found
        training = coverage.training
        metrics = {
            "run_updates": curve.trained,
            "median_update_ratio": training.median("update_ratio"),
            "lr": training.median("lr"),
            "clip": training.median("clip"),
            "steps": float(coverage.stepped_steps or coverage.steps),
            "start": curve.start.mean,
            "end": curve.end.mean,
            "noise": curve.noise,
            "half_from": curve.second_half[0],
            "half_to": curve.second_half[1],
            "shape": SHAPES[shape],
        }
        if curve.chance is not None:
            metrics.update(chance=curve.chance, classes=float(curve.classes))
        finite = {k: v for k, v in metrics.items() if math.isfinite(v)}
        return run_event(KIND, curve.start.first, curve.end.last, "", **finite)

    def undone(self, event: SemanticEvent, coverage: Coverage, facts: RunFacts) -> bool:
        """A stall that passed before the fit (:func:`.loss_evidence.passed_before_the_fit`): it ended, over at most
        :data:`.loss_evidence.PASSED_SPAN` of the run's steps, before the run's last quarter of losses, in a run whose
        loss fell. Residual branches gated at zero by design (a ResNet's zero-initialised last BatchNorm, SkipInit's
        alpha, LayerScale at 1e-6) under a warm-up barely move for their first few steps, their gradients far below
        Adam's epsilon, until the gates grow; the median layer is such a branch, and then the model trains as its
        ungated twin does (held-out accuracy 0.98-0.99 both). So is the stall of a warm-up or of the optimizer's
        start-up that ended on its own (:func:`_warming_start`), whatever the loss shows. A stall that holds, or one
        the loss never got past, is still reported, and so are stalls whose cause is a fact, not a reading: a learning
        rate of 0 (a schedule at 0 for a stretch) and layers clipping held still. (Gated branches' updates may round
        to no change at all in float32: that alone is no learning rate of 0.)"""
        if event.kind is not KIND or "run_updates" in event.metrics or _held_still(event):
            return False
        if event.metrics.get("lr") == 0.0:
            return False
        if "peak_lr" in event.metrics and not _decayed_early(event, coverage):
            return True  # the tail of a schedule at the run's end
        config = facts.config
        return loss_evidence.passed_before_the_fit(event, coverage, config) or _warming_start(event, coverage, config)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a run too small to train after the steps' stalls: a stall read step by step is then its root (_OneStall)
        return RootLane(7.5 if _run_stall(event) else 7)

    def rules(self) -> list[CausalRule]:
        return [_OneStall("one-stall", "is the same stall as", KIND, (KIND,), "other", joins=True)]

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        median = root.metrics.get("median_update_ratio", 0.0)
        lr = root.metrics.get("lr")
        if "run_updates" in root.metrics:
            return _explain_run(root.metrics, optimizer_settings.eps_explains(series, root.step_start, root.step_end))
        if _held_still(root):
            return _explain_clipped([root, *rest], topo)
        if median == 0.0:
            what = (
                f"Stalled updates: no parameter changes at all {held(root, topo)}"
                + (" - the learning rate is 0" if lr == 0.0 else "")
                + "; the loss cannot improve."
            )
            fix = (
                "check the learning-rate scheduler (a schedule sized for epochs but stepped per batch reaches 0 early)."
            )
            return what, fix
        lr_text = f" with learning rate {num(lr)}" if lr is not None else ""
        clip = root.metrics.get("clip")
        clipped = (
            f" - gradient clipping made the gradients {num(clip)} times smaller than the backward pass left them"
            if clip is not None
            else ""
        )
        what = (
            f"Stalled updates{lr_text}: the median update/weight ratio ||dW||/||W|| over the layers is {num(median)} "
            f"per step {held(root, topo)}{clipped}; the weights barely move, so the loss cannot improve."
            + _whole_run(root, rest)
        )
        if "floor_from" in root.metrics:
            return what + _early_floor(root.metrics), _EARLY_FIX
        if clip is not None:
            # the gradients reach the optimizer at the clipping's threshold, which sets the steps' size: the fault
            # is the threshold, not the learning rate that was tuned for unclipped gradients
            return what, f"raise the clipping's threshold: {_CLIP_FIX}"
        eps = optimizer_settings.eps_explains(series, root.step_start, root.step_end)
        if eps is not None:
            # the eps, not the learning rate, shrank the steps: a larger learning rate would leave Adam an SGD
            return what + eps[0], eps[1]
        factor = 1e-3 / median
        fix = (
            f"raise the learning rate (about {num(factor)}x higher reaches the usual ~1e-3 update ratio), and check "
            "the scheduler and warm-up."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        if "run_updates" in event.metrics:
            return (
                f"updates too small to train (the run's add up to {num(event.metrics['run_updates'])} of the weights)"
            )
        ratio = event.metrics.get("median_update_ratio", 0.0)
        if ratio == 0.0:
            return "no parameter moves at all"
        updates = "" if not event.layer and event.param is None else "updates "  # read after "the model's updates"
        return f"{updates}stalled (median update/weight ratio {num(ratio)})"

    def label(self, event: SemanticEvent) -> str:
        return f"stalled: update ratio {num(event.metrics.get('median_update_ratio', 0.0))}"

    def effect(self, event: SemanticEvent) -> str:
        return "stalled updates"


#: How to keep a schedule from decaying early (:func:`_decayed_early`).
_EARLY_FIX = (
    "check the learning-rate scheduler: step ReduceLROnPlateau once per epoch with the validation loss (not on "
    "every batch's loss), with mode='min' for a loss (mode='max' is for a metric that should rise, such as "
    "accuracy), and step a schedule sized in epochs once per epoch (or size it in batches); its floor should come "
    "near the run's end."
)


def _early_floor(m: dict[str, float]) -> str:
    """The words of a schedule that decayed early (see :func:`_decayed_early`)."""
    return (
        f" A schedule brought the learning rate down from {num(m.get('peak_lr', math.nan))} to its floor, a "
        f"hundredth of that or lower, by step {int(m.get('floor_from', 0.0))}, and the run went on at that floor: "
        "the schedule decayed too early and cut the fit short."
    )


def _whole_run(root: SemanticEvent, rest: list[SemanticEvent]) -> str:
    """The run too small to train that the steps' stall joined (:class:`_OneStall`), when it spans more than twice
    the stall's steps: a stall whose steps sit at the edge of ``stalled_ratio`` is dated by its last stretch below it
    (sweep M: Adam with eps=1.0 at 1e-5 to 2.5e-5 of the weights a step from step 0, stalled by the rule at steps
    112-119 only), while the run's updates added up to almost nothing from its first step."""
    run = next((e for e in rest if _run_stall(e)), None)
    if run is None or run.step_end - run.step_start < 2 * (root.step_end - root.step_start + 1):
        return ""
    return (
        f" Over the whole run, steps {run.step_start} to {run.step_end}, the updates added up to "
        f"{num(run.metrics.get('run_updates', 0.0))} of the weights' norm."
    )


def _explain_clipped(events: list[SemanticEvent], topo: Topology) -> tuple[str, str]:
    """The words of layers that clipping holds still (see :meth:`StalledDetector._clipped_still`)."""
    clipped = [e for e in events if _held_still(e)]
    layers = sorted({e.layer for e in clipped}, key=topo.position)
    root = clipped[0]
    shrink = min(e.metrics["clip"] for e in clipped)
    ratio = max(e.metrics.get("median_update_ratio", 0.0) for e in clipped)
    more = f" and {len(layers) - 4} more" if len(layers) > 4 else ""
    named = ", ".join(f"'{layer}'" for layer in layers[:4]) + more
    what = (
        f"Stalled updates in {named} {held(root, topo)}: gradient clipping made their gradients at least "
        f"{num(shrink)} times smaller than the backward pass left them, and their updates move the weights by "
        f"{num(ratio)} of their norm per step or less, while the rest of the model trains. They barely learn."
    )
    fix = (
        "raise the threshold of the clipping over these parameters (max_norm of clip_grad_norm_ or "
        "clip_gradients - 1.0 is usual -, clip_value of clip_grad_value_) or remove it; an optimizer that rescales "
        "the gradient (Adam) is seldom held still by clipping."
    )
    return what, fix


def _explain_run(m: dict[str, float], eps: tuple[str, str] | None = None) -> tuple[str, str]:
    """The words of a run too small to train (see :meth:`StalledUpdates.run_finding`); ``eps``, the words of an
    adaptive optimizer's eps that explains its small steps (:func:`.optimizer_settings.eps_explains`)."""
    total, steps = m.get("run_updates", 0.0), int(m.get("steps", 0.0))
    median = m.get("median_update_ratio")
    per_step = f" (a median update/weight ratio ||dW||/||W|| of {num(median)} per step)" if median is not None else ""
    lr = m.get("lr")
    lr_text = f" at learning rate {num(lr)}" if lr is not None else ""
    shape = m.get("shape", 0.0)
    start, end = m.get("start", 0.0), m.get("end", 0.0)
    if shape == SHAPES["chance"] and "classes" in m:
        loss = (
            f"the loss stayed at chance ({num(start)} to {num(end)}, log({int(m['classes'])}) = "
            f"{num(m.get('chance', 0.0))}): the model learned nothing"
        )
    elif shape == SHAPES["chance"]:  # a BCE's or an MSE's chance level, from its targets
        loss = (
            f"the loss stayed at chance ({num(start)} to {num(end)}, the loss of predicting the targets' mean or "
            "base rate): the model learned nothing"
        )
    elif shape == SHAPES["flat"]:
        loss = f"the loss did not fall ({num(start)} to {num(end)}, within its batch-to-batch spread)"
    elif shape == SHAPES["surrogate"]:
        loss = (
            f"the loss, a policy-gradient surrogate that tells nothing of the fit, went from {num(start)} to {num(end)}"
        )
    else:
        loss = (
            f"the loss was still falling at the end at its pace of the whole run ({num(start)} to {num(end)}; "
            f"{num(m.get('half_from', end))} to {num(m.get('half_to', end))} over its second half): the run ended "
            "long before it could settle"
        )
    moved = (
        "Each step moved the weights, but the steps were too small for this run to train."
        if total > 0
        else "No step moved the weights at all."
    )
    what = (
        f"Stalled updates over the whole run{lr_text}: over {steps} steps the updates added up to {num(total)} of "
        f"the weights' norm{per_step}, and {loss}. {moved}"
    )
    clip = m.get("clip")
    if clip is not None and clip >= loss_evidence.TINY_CLIP:
        fix = f"raise the clipping's threshold (it made the gradients {num(clip)} times smaller): {_CLIP_FIX}"
    elif eps is not None and total > 0:  # the eps, not the learning rate, shrank the steps
        what += eps[0]
        fix = eps[1]
    elif total == 0:
        fix = (
            "check that optimizer.step() is given gradients (nothing may reset them between loss.backward() and "
            "the step) and that its learning rate is not 0."
        )
    else:
        fix = (
            "raise the learning rate (10x at a time, watching that the loss still falls), or train for many more "
            "steps; with clip_grad_norm_ check that max_norm is not far below the gradients' norm."
        )
    return what, fix
