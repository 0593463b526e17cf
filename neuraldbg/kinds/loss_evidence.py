"""What a run's loss curve says, and what the rest of the run says about why: shared by the three loss rooms
(:mod:`.loss_not_decreasing`, :mod:`.unstable_loss`, :mod:`.loss_at_chance`). Not a kind.

The loss of each step is recorded from the backward pass (or given to ``observe_loss``; see
:mod:`neuraldbg.capture.ledger`). It is judged against its own noise, never against a fixed number: the
batch-to-batch spread ``noise`` (from the differences of consecutive losses, which a trend hardly affects) is the
unit. The curve's *start* is the mean of its first eighth (at least 8 losses), its *end* the mean of its last
quarter (at least 8).

* It **fell** when start - end >= noise: over the run it moved more than it moves from one batch to the next (and
  by at least ``LEAST_MOVE`` of its start: a loss that hardly varies from batch to batch does not fall by a
  rounding; the same unit holds for the other verdicts).
* It is **flat** when it fell by less than that with confidence: the drop plus two standard errors (of window means
  whose losses spread by ``noise``) stays below ``noise``; unless it fell by more than two standard errors and by
  ``FELL_BY`` of its start (a loss that spreads by more than its level from batch to batch can fall by a third and
  stay within one spread). In between it is unclear: too short or too noisy a run to tell, and nothing is said.
  A flat curve is no loss that did not decrease when it had fallen before its first eighth ended: to a tenth of
  its first losses (:func:`fell_from_first`), or from them to an end clearly below its chance level
  (:func:`fell_below_chance`: a weak-signal task learned in a few dozen steps, then at its noise floor).
* It is **climbing** when end - start is at least ``noise`` and two standard errors.
* It **stopped** when its second half (its first third against its last third) fell, with the same confidence, by
  less than the second half's own noise (a loss that fell tenfold jumps about tenfold less from batch to batch at
  its end than at its start: the whole run's noise would call a loss still falling steadily stopped): a plateau (a
  converged fit too). A loss that stays positive is judged so by factors, on the scale of its logarithm: a
  heavy-tailed loss (rare batches many times the typical one) spreads by more than its own level from batch to
  batch, and on its own scale could never fall by one spread, however many times it halves. It is still
  **falling** when that second half fell by more than its noise, with the same confidence: a loss passing through
  chance on its way down (a T5 model learning to reverse sequences of 200 tokens, 5.5 -> 5.06 over 300 steps,
  within 5 % of log(200), and 4.45 at 900) is not stuck there.

A loss says nothing about the training, and no loss finding is made, when it is not one objective's: another
optimizer, holding none of the watched parameters, steps during the run (a GAN, an actor and a critic trained
apart: the loss is measured against a model that moves); backward passes reached the model whose gradient its
optimizers never applied while several of them step its parts (the discriminator inside the generator's loss, both
in one module: under one optimizer a discarded pass is the same objective's, sharpness-aware minimisation's first
pass on the same batch); different sets of optimizers step on
different steps (layers trained one by one on local losses); the loss is negative on 5 % of the steps or more
(a policy gradient, an adversarial or a density loss: a surrogate, not a fit falling towards a floor); or the
input batch, or the number of forward passes per step, changes on most steps (reinforcement-learning episodes: a
sum over an episode grows with its length). A run of fewer than ``loss_min_steps`` losses is a smoke run:
inconclusive. A loss that never got finite is the non-finite room's. A loss that stays where it began, or at
chance, is judged only after updates adding up to ``loss_trained`` of the weights' norm (a gentle run may not have
started to fall), unless it is held at its chance level batch after batch (:func:`held_at_chance`): a loss that
has not started to fall still moves with its batches, one that an output ignoring its input gives does not.

What a careful engineer would look at next is in :func:`causes`: the evidence for each likely cause, ranked.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass

from ..capture.coverage import Coverage, RunFacts
from ..config import DebugConfig
from ..events import SemanticEvent
from ..stats import samples
from ..stats.losses import LossTrace, Stretch, combine
from ..stats.training import TrainingFacts
from ..text import count, num
from .base import LAST_RANK, Kind, RootLane, Series, run_event

#: The least move of a loss that counts, as a share of its start, when its batch-to-batch spread is smaller: a loss
#: that hardly varies from batch to batch (a skip-gram model held at 6 log 2 by its zero-initialised output vectors
#: under SGD: 4.1589 -> 4.1588, a spread of 1e-5) neither fell nor climbed by moving a thousandth of a percent.
LEAST_MOVE = 0.01
#: Losses in each of the start and end windows, at least.
WINDOW = 8
#: A loss that fell by more than two standard errors of its windows and by at least this share of its start is not
#: flat, however much more it spreads from batch to batch (tasks or noise levels that differ from batch to batch: a
#: meta-learner over sine tasks of amplitudes 0.1-5, 3.9 -> 3.0 against a spread of 1.7, its held-out error down by a
#: third). A run with nothing to learn falls by two standard errors on one run in forty, by chance.
FELL_BY = 0.1
#: Weights whose norm grew this many times over a run were pushed by steps too large (calibrated: healthy programs
#: of the real-programs benchmark at most 2.0, a language model under SGD lr 20; too high learning rates 2.8-4.7).
WEIGHT_GROWTH = 2.5
#: Clipping that shrinks the gradients this many times is why the updates are small, not a short run.
TINY_CLIP = 100.0
#: A loss negative on this fraction of the steps is a surrogate objective, not a fit.
NEGATIVE_SHARE = 0.05
#: The losses whose chance level their targets give, as an event's metric ``baseline``.
BASELINES = {"bce": 1.0, "mse": 2.0}
#: A loss whose last quarter spreads by at most this share of its level, batch after batch, is held there: nothing
#: the updates change reaches it. A loss that depends on its inputs moves with the batch (a batch's mean of
#: per-sample losses that vary by a tenth of their level spreads by 1e-4 of it at a million samples), and one that
#: depends on the weights moves with the updates. Measured: a CLIP whose text tower pools the same position for
#: every caption (an ``eos_token_id`` its vocabulary lacks) holds its loss at log 16 to 2.5e-6 of it from step 50
#: to 200 (zero-shot accuracy 0.055 against 1.00 for its twin), its updates adding up to 0.09 of the weights' norm.
PINNED = 1e-5
#: ... judged whatever the run's updates added up to, from this share of ``loss_trained`` (below it the weights
#: hardly moved, and a loss they do reach holds still too: the stalled-updates room's ``RUN_SHARE``).
PINNED_MOVED = 0.1


@dataclass(frozen=True)
class Curve:
    """A run's loss curve, read. ``verdict``: ``"fell"``, ``"flat"``, ``"climbing"`` or ``"unclear"`` (neither a
    fall of one spread nor, within two standard errors, less than that: too noisy or too short to tell)."""

    losses: int
    start: Stretch
    end: Stretch
    noise: float
    verdict: str
    stopped: bool  # the second half fell by less than its noise
    falling: bool  # ... by more than its noise, with the same confidence: the loss is still on its way down
    second_half: tuple[float, float]  # the mean of the first and the last third of the second half
    by_factors: bool  # ... judged on the scale of the loss's logarithm (it stays positive)
    half_noise: float  # the second half's noise on that scale (a factor when by_factors, else in loss units)
    chance: float | None  # log(classes), when the output has classes and the first loss is near it
    classes: int
    trained: float  # the per-step update ratios, added up over the run (NaN: not measured)
    large_updates: str  # the evidence of a learning rate too high, in words ("" when there is none)
    band: float
    prior: float | None = None  # the entropy of the labels' frequencies, when it lies below the band of chance
    # a binary cross-entropy's or a mean squared error's chance level from its targets (see target_chance): the
    # loss's kind ("bce", "mse"; "" for none), the per-column level and the pooled one
    baseline: str = ""
    target_level: float = math.nan
    target_pooled: float = math.nan
    # the loss on samples the model had never seen stayed at chance while it memorised the ones it saw again (see
    # :func:`memorised`): its numbers, or None
    memorised: dict[str, float] | None = None
    # a cross-entropy whose first loss lay far above chance (logits scaled up at the start: a contrastive model's
    # temperature, an angular margin's scale): it may end above chance and still have learned
    scaled_start: bool = False
    first: float = math.nan  # the run's first loss

    @property
    def pinned(self) -> float | None:
        """The spread of the last quarter's losses as a share of their level (a standard deviation over the mean)
        when it is at most :data:`PINNED`: a loss held at one value batch after batch (see :data:`PINNED`); else
        None, and None for a loss at zero or one rounded to half precision (:func:`_coarse`)."""
        end = self.end
        if end.mean <= 0 or _coarse(end.mean):
            return None
        spread = end.sd / end.mean
        return spread if spread <= PINNED else None

    @property
    def level(self) -> float | None:
        """The loss of a classifier that learned nothing from its inputs: log(classes), or the entropy of the
        labels' frequencies when the classes are imbalanced (predicting each class with its frequency)."""
        c = self.chance
        return c if c is None or self.prior is None else min(c, self.prior)

    @property
    def at_chance(self) -> bool:
        """The loss ends within the band around the chance level (:attr:`level`), or between it and the band around
        log(classes) (imbalanced classes: a loss still at equal odds has not even learned the labels'
        frequencies): the predictions are no better than a guess. For a binary cross-entropy or a mean squared
        error, the chance level its targets give (:attr:`at_target_chance`)."""
        return self.at_chance_of_classes or self.at_target_chance

    @property
    def at_target_chance(self) -> bool:
        """A binary cross-entropy or a mean squared error that ends within the band around the per-column level its
        targets give, or between it and the band around the pooled level (a model that learned one rate, or one
        mean, for every column): the mean binary entropy of the labels' base rates, the mean of the targets'
        variances."""
        low, high = self.target_level, max(self.target_level, self.target_pooled)
        return bool(self.baseline) and (1 - self.band) * low <= self.end.mean <= (1 + self.band) * high

    @property
    def at_chance_of_classes(self) -> bool:
        """The loss ends at a classifier's chance level (:attr:`level`, log(classes)), not only at its targets'."""
        c, level = self.chance, self.level
        if self.scaled_start and self.end.mean < SCALED_FELL * self.first:
            return False  # fell far from a start inflated by a scale or a margin: a margin moves where its floor is
        return c is not None and level is not None and (1 - self.band) * level <= self.end.mean <= (1 + self.band) * c

    @property
    def target_high(self) -> float:
        """The higher of the targets' two chance levels (per column, pooled)."""
        return max(self.target_level, self.target_pooled)

    @property
    def far_above_targets(self) -> bool:
        """A mean squared error that ends at :data:`FAR_ABOVE` times its targets' variance or more (the pooled one
        when larger): its predictions are far worse than predicting the targets' mean, far off their scale."""
        return self.baseline == "mse" and self.end.mean >= FAR_ABOVE * self.target_high

    @property
    def above_chance(self) -> bool:
        """The loss ends above the band around log(classes), where it began: training made the predictions worse
        than a guess."""
        c = self.chance
        return c is not None and not self.scaled_start and self.end.mean > (1 + self.band) * c


def skipped(coverage: Coverage) -> str:
    """Why the run's loss says nothing about its training ("" when it does): see the module docstring."""
    losses = coverage.losses
    if coverage.foreign_optimizer_steps:
        return (
            "another optimizer, holding none of this model's parameters, stepped during the run (a GAN, an actor "
            "and a critic trained apart): this loss is measured against a model that moves"
        )
    if coverage.discarded_backwards and coverage.optimizers_at_once > 1:
        # several optimizers step the model's parts: a pass whose gradient none applied served another part's loss (a
        # generator and its discriminator in one module). Under one optimizer the passes are the one objective's
        # (sharpness-aware minimisation's first pass, at the perturbed weights, on the same batch; or a step taken
        # less often than the passes, discarded_gradients' own finding)
        return (
            f"{coverage.discarded_backwards} backward passes reached this model whose gradient its optimizers never "
            "applied (it also serves another part's loss, as a GAN's discriminator does)"
        )
    if coverage.optimizer_changes:
        return "different optimizers stepped on different steps: each trains its own loss"
    if losses.count and losses.negative >= NEGATIVE_SHARE * losses.count:
        return (
            f"the loss is negative on {losses.negative} of {losses.count} steps: a surrogate objective (a policy "
            "gradient, an adversarial or a density loss), not a fit falling towards a floor"
        )
    if coverage.steps > 1 and coverage.size_changes > (coverage.steps - 1) / 2:
        return (
            "the input batch, or the number of forward passes, changes on most steps (episodes of different "
            "lengths): the loss follows the batch, not only the model"
        )
    return ""


def finding(coverage: Coverage, config: DebugConfig) -> tuple[str, Curve] | None:
    """Which loss finding the run's curve makes, if any, with the curve: ``"loss_at_chance"`` (a classifier's loss
    ends at log(classes)), else ``"unstable_loss"`` (it climbs, or it stopped falling while the updates are a large
    fraction of the weights), else ``"loss_not_decreasing"`` (it fell by less than its noise). One curve makes one
    finding at most. None also while the learning rate is still warming up (rising), for a run attached after its
    optimizer had stepped (a flat loss may be a converged one), and when the gradients were exactly zero (a
    degenerate loss, its own room's)."""
    curve = judged(coverage, config)
    if curve is None or coverage.policy_gradient:
        # a policy-gradient loss is a surrogate: it rises as the returns the agent earns grow, and its value head's
        # error grows with them (an A2C that solves CartPole: 8.8 -> 10.7); whether the agent learns is not in it
        return None
    trained = enough_training(coverage, config, curve)
    if curve.at_chance and ((trained and not curve.falling) or held_at_chance(curve, config)):
        return "loss_at_chance", curve
    memo = memorised(coverage, curve)
    if memo is not None:
        return "loss_at_chance", dataclasses.replace(curve, memorised=memo)
    if curve.verdict == "climbing" or curve.above_chance:
        return "unstable_loss", curve
    if curve.far_above_targets:  # no gate on the updates: no healthy start or stall leaves a fit this far off
        return "loss_at_chance", curve
    if curve.stopped and curve.large_updates and curve.verdict != "flat" and not converged(coverage, curve):
        return "unstable_loss", curve
    if (
        curve.verdict == "flat"
        and not curve.falling  # still on its way down at the end (after a rise: a VQ-VAE's codebook terms)
        and trained
        and not coverage.warm_start
        and not met_trained(coverage, curve)
        and not fell_from_first(coverage, curve)
        and not fell_below_chance(coverage, curve)
    ):
        return "loss_not_decreasing", curve
    return None


#: A cross-entropy whose first loss lay far above chance (:attr:`Curve.scaled_start`) and that ended below this share
#: of it learned more than to guess, wherever it ends: a CosFace margin's loss falls from 6.9 to 2.2, near log(10),
#: while held-out accuracy reaches 0.9; a CLIP given shuffled pairs only sheds its temperature, 5.9 to 4.1 = log 64.
SCALED_FELL = 0.5


#: The run's first losses, whose mean says where a loss began ...
FIRST_LOSSES = 8
#: ... and a loss whose end averages this share of it or less fell, whatever its spread.
FELL_SHARE = 0.1


def two_errors(noise: float, n: int, m: int) -> float:
    """Two standard errors of the difference between the means of ``n`` and ``m`` losses that spread by ``noise``."""
    return 2 * noise * math.sqrt(1 / n + 1 / m)


def first_losses_mean(coverage: Coverage) -> float | None:
    """The mean of the run's first ``FIRST_LOSSES`` finite losses: where its loss began; None before any."""
    first = [value for _, value in coverage.losses.first[:FIRST_LOSSES]]
    return sum(first) / len(first) if first else None


def fell_from_first(coverage: Coverage, curve: Curve) -> bool:
    """A positive loss whose last quarter averages at most ``FELL_SHARE`` of its first ``FIRST_LOSSES`` losses fell:
    a task learned in its first steps leaves a first eighth already low and a batch-to-batch spread made of those
    steps' jumps, so the drop from the eighth is "less than the spread" (a CNN under BCE whose loss went 0.69 ->
    0.013 over its first eighth and on to 1.8e-6, held-out accuracy 1.0: fuzzed configuration 226 of hunt 16)."""
    began = first_losses_mean(coverage)
    return began is not None and coverage.losses.positive and curve.end.mean <= FELL_SHARE * began


def guess_level(curve: Curve) -> float | None:
    """The loss of a model that learned nothing from its inputs, when the run knows it: a classifier's
    :attr:`Curve.level` (log(classes), or the entropy of its labels' frequencies), else the level a binary
    cross-entropy's or a mean squared error's targets give per column (:func:`target_chance`); None otherwise."""
    if curve.level is not None:
        return curve.level
    return curve.target_level if curve.baseline else None


def fell_below_chance(coverage: Coverage, curve: Curve) -> bool:
    """A loss that fell from where it began to an end clearly below its chance level (:func:`guess_level`) learned
    from its inputs, however flat it was after its first eighth: a task whose signal is weak is learned within a few
    dozen steps, and its loss then sits at its noise floor, a little under its start, for the rest of a long run, so
    the drop from the first eighth is "less than the spread" (a 3-class toy of overlapping Gaussians: 0.97 over its
    first 8 losses, 0.62 over its first eighth, 0.60 at its end, log 3 = 1.10, held-out accuracy 0.74 against a
    Bayes optimum of 0.75; a weak-signal tabular BCE: 0.67, 0.57, 0.54 against its labels' 0.68, AUC 0.754 against
    0.760). It fell when its end lies below the mean of its first ``FIRST_LOSSES`` losses, or below the chance level
    itself when its very first loss lay at chance or above (an untrained model's: the whole fall from chance happened
    in this run), by one batch-to-batch spread and two standard errors; and clearly below chance when it lies under
    the band around chance by one spread more. Labels the inputs do not predict leave the loss at chance, and so does
    a dead network; a learning rate far too low leaves it where it began; memorising shuffled labels falls slowly,
    long after the first eighth (:func:`memorised`)."""
    level, began = guess_level(curve), first_losses_mean(coverage)
    if level is None or began is None:
        return False
    if curve.first >= (1 - curve.band) * level:
        began = max(began, level)
    first = min(len(coverage.losses.first), FIRST_LOSSES)
    end = curve.end
    error = two_errors(curve.noise, first, end.n)
    fell = began - end.mean >= curve.noise + error
    return fell and end.mean + curve.noise <= (1 - curve.band) * level


def unjudged_moves(coverage: Coverage, config: DebugConfig) -> float | None:
    """How much a run whose loss did not fall, or fell to its chance level, moved its weights, when that was too
    little to judge it (its per-step update ratios added up to less than ``loss_trained``, without clipping to a tiny
    norm): a loss that stayed where it began, or that only shed an initialisation's excess down to a guess (a Swin
    under Lightning from 1.45 to log 4 = 1.386, held-out accuracy 0.25), may be one that has not started to fall,
    and :func:`finding` says nothing; None otherwise (no curve, a loss that fell below chance or climbed, or updates
    enough to judge)."""
    curve = judged(coverage, config)
    if curve is None or not (curve.verdict in ("flat", "unclear") or (curve.at_chance and not curve.falling)):
        return None
    if enough_training(coverage, config, curve) or held_at_chance(curve, config):
        return None
    return curve.trained


def enough_training(coverage: Coverage, config: DebugConfig, curve: Curve) -> bool:
    """Whether the run trained enough to judge a loss that stays where it began: the updates added up to
    ``loss_trained`` of the weights' norm, or clipping to a tiny norm is why they did not (a smoke run at a small
    learning rate is inconclusive: its loss may not have started to fall)."""
    clip = coverage.training.median("clip")
    return not curve.trained < config.loss_trained or (math.isfinite(clip) and clip >= TINY_CLIP)


def held_at_chance(curve: Curve, config: DebugConfig) -> bool:
    """A loss at its chance level held there batch after batch (:attr:`Curve.pinned`) while the updates added up to
    :data:`PINNED_MOVED` of ``loss_trained`` or more: judged at chance however small the updates were. A loss that
    has not started to fall still moves with its batches; one held at a guess to a hundred-thousandth of it is the
    loss of an output that carries nothing of its input, and nothing the updates change reaches it. Such a loss
    still falling (against a spread that small, a creep of a millionth is a fall) is not passing through chance when
    it lies at the level itself, within :data:`PINNED` of it: it is settling on the guess. Only at a chance level
    the loss names: a loss held elsewhere may sit at a saddle the updates are slowly leaving (word2vec's output
    vectors started at zero under SGD at 0.05: its custom loss held at 6 log 2 to 2.5e-7 of it for 300 steps, its
    distance below that level growing steadily, 0.8e-6 to 5.2e-6 over the run's quarters)."""
    level = curve.level
    if level is None or not curve.at_chance or curve.pinned is None:
        return False
    if curve.trained < PINNED_MOVED * config.loss_trained:
        return False  # the weights hardly moved: the stalled updates' story, and no evidence a loss they reach moves
    return not curve.falling or abs(curve.end.mean - level) <= PINNED * level


def _coarse(value: float) -> bool:
    """Whether ``value`` is one a half-precision loss takes (float16, or bfloat16: a float32 whose low 16 bits are
    zero): such a loss holds one value while it moves by less than its rounding step (0.4 % of it in bfloat16), so
    its stillness is no evidence."""
    try:
        if struct.unpack("e", struct.pack("e", value))[0] == value:
            return True
    except OverflowError:  # beyond float16's range
        pass
    try:
        single = struct.pack("<f", value)
    except OverflowError:
        return False
    return struct.unpack("<f", single)[0] == value and single[:2] == b"\0\0"


#: New samples (never seen before by the model) are judged from this many steps into the run (the first steps of
#: any model are at chance) ...
NEW_FROM = samples.LOSSES_FROM
#: ... when there are at least this many of them.
NEW_SAMPLES = 24
#: ... or, over the second half of the steps whose samples were fingerprinted, at least this many: a training set
#: drawn from with replacement has few new samples left by the time memorising shows (2,000 rows drawn 64 at a time
#: with shuffled labels: 65 new samples from step 32, most before step 100, where the seen ones were still at
#: chance too; from step 128 on, 7 new ones at 1.19x chance and the seen ones at 0.86x).
NEW_LATE = 6
#: The run's loss ends at this share of the chance level or above: memorising labels the inputs do not give is slow
#: (shuffled-label runs of hunted programs end at 0.78-0.99 of chance: MLPs of 2 and 10 classes, a tagger, an
#: embedding-bag classifier), while a model that learns from its inputs, even one that starts late, ends far lower
#: (a tiny BERT whose gradients are clipped to 1e-4: at chance on its first epoch's new samples, 0.16 of chance at
#: its end, held-out accuracy 0.94).
MEMORISED_END = 0.6


def memorised(coverage: Coverage, curve: Curve) -> dict[str, float] | None:
    """A classifier that memorises labels its inputs do not give (shuffled or random labels over a training set it
    sees more than once), from each sample's own loss on the fully observed steps, split into samples it has seen
    before and samples it has not (see :mod:`neuraldbg.stats.samples`), compared *on the same steps* (the same
    weights): over the steps from :data:`NEW_FROM` on whose batches hold both, the new samples' loss is still at
    chance (at or above the lower edge of the band around :attr:`Curve.level`; at least :data:`NEW_SAMPLES` of
    them, and their class picked right no more often than a guess picks it, see :func:`_guessed`) while the seen
    ones' is lower, by two standard errors of the steps' differences weighed together; or the same over the second
    half of those steps alone (at least :data:`NEW_LATE` new samples there), where memorising shows. A model
    that learns from its inputs predicts a new sample about as well as a seen one at the same weights, however slow
    its progress; one that can only memorise predicts new samples no better than a guess. Comparing new samples of
    early steps with seen samples of late ones instead would take any slow learner for a memoriser (a hunt of
    healthy classifiers with noisy labels and small learning rates: 19 of 33 flagged that way, before this rule
    compared them at the same steps). The run's whole loss may end below chance (memorising, 0.87 of log(10) after
    ten epochs), where the band of :attr:`Curve.at_chance` misses it, though not below :data:`MEMORISED_END` of it.
    Its numbers as metrics, or None."""
    chance, level = curve.chance, curve.level
    repeats = coverage.repeats
    if chance is None or level is None or not repeats.repeated or not repeats.rows:
        return None
    if curve.end.mean < MEMORISED_END * level:
        return None  # fitted far below chance: learned from the inputs (memorising random labels is slow)
    every = repeats.paired(NEW_FROM)
    top = coverage.label_prior[3] if len(coverage.label_prior) == 4 else 0.0
    guess = max(math.exp(-level), top)  # a guess's accuracy: see _guessed
    if every is None or every[0].n < NEW_SAMPLES or every[1].n < NEW_SAMPLES or not _guessed(every[0], guess):
        return None  # too few new samples, or new ones predicted better than a guess: the model learns from inputs
    edge = (1 - curve.band) * level
    late = max(NEW_FROM, repeats.rows[-1].step // 2)
    paired = _memorising(every, NEW_SAMPLES, edge) or _memorising(repeats.paired(late), NEW_LATE, edge)
    if paired is None:
        return None
    new, seen, difference, _, first, last = paired
    judged = {"new_accuracy": every[0].accuracy, "guess_accuracy": guess} if every[0].judged else {}
    return {
        **judged,
        "new_loss": new.mean,
        "new_samples": float(new.n),
        "new_from": float(first),
        "new_until": float(last),
        "seen_loss": seen.mean,
        "seen_samples": float(seen.n),
        "memorised_gap": difference,
    }


def _guessed(new: samples.Losses, guess: float) -> bool:
    """Whether the new samples were predicted right no more often than a guess does: at most two standard errors
    above ``guess``, what a guess scores: exp(-level), the accuracy of a guess whose cross-entropy is the chance
    level (1/classes for balanced classes), or the most frequent label's share (always picking it), when that is
    more (shuffled labels keep their frequencies, and a memoriser learns them first). A model overconfident
    on labels that are mostly noise has a loss on new samples above chance and yet picks their class far more
    often than a guess (plain torch: 60 % of the labels random, new samples' loss 1.03x chance, held-out accuracy
    0.56 against 0.1). True when no hit was read."""
    if not new.judged:
        return True
    return new.accuracy <= guess + 2 * math.sqrt(guess * (1 - guess) / new.judged)


def _memorising(paired: samples.Paired | None, least: int, edge: float) -> samples.Paired | None:
    """``paired`` (new and seen samples compared on the same steps, :meth:`SampleRepeats.paired`) when at least
    ``least`` new and :data:`NEW_SAMPLES` seen ones show memorising: the new ones' loss at or above ``edge`` (still
    a guess) and the seen ones' lower by two standard errors; else None."""
    if paired is None:
        return None
    new, seen, difference, error, _, _ = paired
    if new.n < least or seen.n < NEW_SAMPLES:
        return None
    if new.mean < edge:
        return None  # new samples are predicted better than a guess: the model learns from its inputs
    if not difference > 2 * error:
        return None  # seen samples no better than new ones at the same weights: nothing memorised
    return paired


#: A mean squared error that ends at this many times its targets' variance or more is far off their scale, whatever
#: the run's length or its updates (a trained regression ends below the variance; one that did not move ends near
#: it, where it starts from a unit-scale output and standardised targets). Plain torch, a matrix-factorisation
#: recommender with weights of std 10: MSE 1.6e5 -> 1.1e5 over 400 steps against a variance of 1.26 (held-out RMSE
#: 336 against 0.52); targets around 5 with a spread of 0.08: 63x after 300 steps; the same targets standardised:
#: 0.13x. A short run still on its way from a unit-scale output to targets around 5 with a spread of 0.77 ends at
#: 12x (120 steps at Adam 4e-4, the loss a third of where it began and falling fast): not called off scale.
FAR_ABOVE = 30.0


#: A classifier whose first losses average below this share of log(classes) was met already trained.
TRAINED_START = 0.5


def met_trained(coverage: Coverage, curve: Curve) -> bool:
    """A classifier (its loss a cross-entropy, read from the loss graph) met already trained: the mean of its first
    losses is under ``TRAINED_START`` of log(classes), where an untrained classifier's cross-entropy is (about log
    of the number of classes: it picks them with about equal odds). A fine-tuning script that builds a new optimizer
    for a model trained before (so no optimizer state says so, as it does for a resumed run) meets a fit that may
    have converged: its flat loss is the floor it reached (an MLP trained 2,000 steps to 0.19 on 5 noisy classes,
    log 5 = 1.61, then fine-tuned under AdamW at 1e-3: 0.192 -> 0.191), not a model that cannot learn. A mean
    squared error's chance is its targets' variance (:func:`target_chance`): a regression whose first losses are
    under ``TRAINED_START`` of it was met already fitted (an MLP trained 1,500 steps, continued at 5e-5)."""
    level = chance_level(coverage)[1]
    if bool(coverage.classifier_loss) and level is not None and curve.start.mean < TRAINED_START * level:
        return True
    targets = target_chance(coverage)  # a mean squared error's: its targets' variance (predicting their mean)
    return targets is not None and targets[0] == "mse" and curve.start.mean < TRAINED_START * targets[1]


def chance_level(coverage: Coverage) -> tuple[int, float | None]:
    """The classes a classifier picks among and log of their number, the cross-entropy of picking them with equal
    odds (log 2 for one output unit holding probabilities: a sigmoid's); None for an output without classes. The
    classes are the last dimension of the model's output, unless its averaged ``nll_loss`` (one row of classes per
    sample) chose among another number of finite entries per row: a contrastive loss over a batch's similarities
    (SimCLR's NT-Xent, its own column masked with -inf: 2N - 1 of them), logits an outside head made, a mask of
    illegal moves. Those are the loss's own options. A loss the graph shows to be a mean squared error has no such
    level, however many outputs the model has (a diffusion model's two noise coordinates are no two classes). When
    the labels of an ``nll_loss`` were read, its input's dimension 1 holds the classes (a segmentation's (N, C, H, W)
    logits end in the image's width)."""
    facts = coverage.training
    if coverage.baseline_kind in ("mse", "huber") or coverage.regression_target:
        return facts.classes, None  # the graph shows a loss by value: no classes (an MSE's chance is a variance)
    options = coverage.loss_options
    if coverage.classifier_mean and options >= 2 and round(options) != facts.classes:
        return round(options), math.log(options)
    # the classes the loss's own input holds on its dimension 1 (an nll_loss over images or sequences: (N, C, H, W)
    # logits, whose last dimension is the image's width), when its labels were read; else the output's last
    classes = coverage.label_classes or facts.classes
    if classes > 1 and coverage.mixture_loss and not coverage.classifier_loss and not coverage.label_classes:
        # the loss marginalises a log_softmax's output and normalises no logits: the output's last dimension holds a
        # mixture's components, no classes (a mixture density network's K Gaussians)
        return classes, None
    if classes > 1:
        return classes, math.log(classes)
    return classes, math.log(2.0) if classes == 1 and facts.probabilities is True else None


def fell_below(curve: Curve, before: float, share: float) -> bool:
    """Whether the run's last quarter of losses averages at most ``share`` of ``before`` (where the loss stood before
    something happened) and lies below it by more than the loss's batch-to-batch spread."""
    return curve.end.mean <= share * before and curve.end.mean + curve.noise < before


def judged(coverage: Coverage, config: DebugConfig) -> Curve | None:
    """The run's curve (:func:`read`) when it can say how the run trained: None also while the learning rate is
    still warming up at the end of the run, or was raised late in it (its last tenth above :data:`STILL_RISING`
    times its level over 40-80 % of the run: the run has not trained at its learning rate for long; a raise is the
    oversized updates' to tell, from the step it came) and when the gradients were exactly zero on half the readings
    or more (a degenerate loss, its own room's). A warm-up that ended earlier leaves the run judged: comparing the end
    with the first tenth instead left every run whose warm-up filled its first tenth unjudged (hunt 22: a transformer
    warmed up over its first epoch of ten, at chance throughout on shuffled labels, was called healthy without a
    word on its loss)."""
    curve = read(coverage, config)
    zeros, readings = coverage.zero_gradient_readings, coverage.gradient_readings
    if curve is None or (readings and 2 * zeros >= readings):
        return None
    facts = coverage.training
    before, end = facts.median("lr", 0.4, 0.8), facts.median("lr", 0.9, 1.0)
    if math.isfinite(before) and math.isfinite(end) and end > STILL_RISING * before:
        return None
    return curve


#: A learning rate whose last tenth is above this many times its level over 40-80 % of the run is still warming up
#: or was raised late (a linear warm-up still under way at the end: about 1.6).
STILL_RISING = 1.2


#: A passing state lasted at most this share of the run's steps (see :func:`passed_before_the_fit`).
PASSED_SPAN = 0.25


def passed_before_the_fit(event: SemanticEvent, coverage: Coverage, config: DebugConfig) -> bool:
    """Whether ``event`` was a passing state of a run that then fitted: it ended (not still holding at the last
    check), lasted at most :data:`PASSED_SPAN` of the run's steps, ended before the run's last quarter of losses, and
    the run's loss fell (against its own spread; not to chance). Dead units that came back, small gradients and
    stalls that passed are undone by it."""
    if event.metrics.get("ongoing"):
        return False
    curve = read(coverage, config)
    if curve is None or curve.verdict != "fell" or curve.at_chance:
        return False
    steps = max(coverage.last_step + 1, 1)
    return event.steps <= PASSED_SPAN * steps and event.step_end < curve.end.first


def converged(coverage: Coverage, curve: Curve) -> bool:
    """A fit that converged, not one held up: its loss fell a hundredfold, or its gradients did (a stationary
    point; the thresholds of ``fit_loss_drop`` and of the stalled-updates room's stationary point). A loss that ends
    at its chance level (:attr:`Curve.at_chance`: a classifier's log(classes), a regression's targets' variance) did
    not converge, whatever its gradients did: they fall as much when a layer dies (hunt 20: a CNN with dropout 0.9
    lost its last BatchNorm's channels, its gradients fell a hundredfold, its loss ended at log 5 = 1.61), and when a
    model that cannot fit its targets reaches the best it can (hunt 23: a coordinate network with its activations
    removed, trained full-batch, stopped at its best affine fit, R^2 0.008)."""
    if curve.start.mean > 0 and curve.end.mean <= 0.01 * curve.start.mean:
        return True
    if curve.at_chance:
        return False
    facts = coverage.training
    g0, g1 = facts.median("grad_norm", 0.0, 0.1), facts.median("grad_norm", 0.9, 1.0)
    return math.isfinite(g0) and math.isfinite(g1) and g1 <= 0.01 * g0


def read(coverage: Coverage, config: DebugConfig) -> Curve | None:
    """The run's loss curve, or None when it cannot be judged: too few finite losses, a loss that was not finite
    on some step (the non-finite room's story), or not one objective's."""
    trace = coverage.losses
    if trace.count < config.loss_min_steps or trace.nonfinite or skipped(coverage):
        return None
    start, end = _window(trace, 1 / 8), _window(trace, -1 / 4)
    if start is None or end is None:
        return None
    noise = trace.noise()
    drop = start.mean - end.mean
    error = two_errors(noise, start.n, end.n)  # two standard errors of the drop
    unit = max(noise, LEAST_MOVE * abs(start.mean))  # a loss that barely moves from batch to batch: a share of it
    if drop >= unit:
        verdict = "fell"
    elif -drop >= max(unit, error):
        verdict = "climbing"
    elif drop + error < unit and not (drop > error and drop >= FELL_BY * abs(start.mean)):
        # confidently less than one batch-to-batch spread, unless it confidently fell by a tenth of its start or more
        verdict = "flat"
    else:
        verdict = "unclear"
    first_third, last_third = _window(trace, 1 / 6, 0.5), _window(trace, -1 / 6)
    by_factors = trace.positive  # a loss that stays positive moves by factors: judged on the log scale
    if first_third is not None and last_third is not None:
        second = (first_third.mean, last_third.mean)
        local = trace.local_noise(0.5, log=by_factors)  # the second half's own spread, not the whole run's
        spread = two_errors(local, first_third.n, last_third.n)
        if by_factors:
            a, b = _window(trace, 1 / 6, 0.5, log=True), _window(trace, -1 / 6, log=True)
            drop = a.mean - b.mean if a is not None and b is not None else math.nan
        else:
            drop = second[0] - second[1]
        stopped = drop + spread < local
        falling = drop - spread >= local
        half_noise = math.exp(local) if by_factors else local
    else:
        second, stopped, falling, half_noise = (end.mean, end.mean), False, False, math.nan
    facts = coverage.training
    classes, level = chance_level(coverage)
    # the output has classes and its first loss is an untrained classifier's: near chance, or above it when the
    # loss is known to be a cross-entropy (its labels were read): logits scaled up at the start (a contrastive
    # model's temperature of 0.07, an oversized initialisation) put an untrained classifier's loss far above chance
    first = trace.first[0][1] if trace.first else math.nan
    ceiling = level / 0.75 if level is not None else math.nan
    scaled_start = bool(coverage.label_classes) and first > ceiling
    untrained = level is not None and 0.75 * level <= first and (first <= ceiling or scaled_start)
    chance = level if untrained else None
    targets = target_chance(coverage) or ("", math.nan, math.nan)
    return Curve(
        losses=trace.count,
        start=start,
        end=end,
        noise=noise,
        verdict=verdict,
        stopped=stopped,
        falling=falling,
        second_half=second,
        by_factors=by_factors,
        half_noise=half_noise,
        chance=chance,
        classes=classes,
        trained=_trained(facts, coverage.stepped_steps or coverage.steps),
        large_updates=large_updates(facts, config),
        band=config.loss_chance_band,
        prior=label_prior(coverage, config.loss_chance_band) if chance is not None else None,
        baseline=targets[0],
        target_level=targets[1],
        target_pooled=targets[2],
        scaled_start=scaled_start,
        first=first,
    )


#: Inputs whose root-mean-square is at least this are far from unit scale (the unnormalised-inputs room's limit):
#: a loss at its targets' chance level then says more about the data's scale than about targets not matching
#: (a forecaster on raw values x1000 ends at its targets' variance).
RAW_INPUT_RMS = 20.0


def early_input_rms(series: Series | None, last_step: int) -> float | None:
    """The input batch's root-mean-square over the first quarter of the run: the median of the history series
    ``input_rms`` there (None when it was not recorded)."""
    points = series("input_rms", "") if series is not None else []
    if not points:
        return None
    quarter = max(points[0][0], last_step // 4)
    early = sorted(v for step, v in points if step <= quarter)
    return early[len(early) // 2]


def raw_input_rms(series: Series | None, last_step: int) -> float | None:
    """The input batch's root-mean-square over the first quarter of the run (:func:`early_input_rms`) when it lies
    far from unit scale (:data:`RAW_INPUT_RMS` or more); else None."""
    raw = early_input_rms(series, last_step)
    return raw if raw is not None and math.isfinite(raw) and raw >= RAW_INPUT_RMS else None


#: An input batch whose root-mean-square is at most this is far below unit scale: pixels in [0, 1] divided by 255
#: again give about 0.002 (in [0, 1]: 0.3-0.6; a one-hot vector over 40,000 words: 0.005).
FAINT_INPUT_RMS = 0.005


def faint_input_rms(series: Series | None, last_step: int) -> float | None:
    """The input batch's root-mean-square over the first quarter of the run (:func:`early_input_rms`) when it lies
    far below unit scale (:data:`FAINT_INPUT_RMS` or less, above 0); else None."""
    faint = early_input_rms(series, last_step)
    return faint if faint is not None and math.isfinite(faint) and 0 < faint <= FAINT_INPUT_RMS else None


def raw_target_rms(series: Series | None) -> float | None:
    """The root-mean-square of a regression's targets (a mean squared error's or a Huber loss's, read from the
    first backward passes: the last reading, of the most samples; history series ``target_rms``) when it lies far
    from unit scale (:data:`RAW_INPUT_RMS` or more, as for inputs); else None."""
    points = series("target_rms", "") if series is not None else []
    if not points:
        return None
    raw = points[-1][1]
    return raw if math.isfinite(raw) and raw >= RAW_INPUT_RMS else None


#: Samples per column, at least, before the targets' base rates or variances are a chance level (estimated from
#: the first backward passes' targets: :data:`LABELS_PER_CLASS` for each of a binary label's two values).
TARGETS_PER_COLUMN = 20


def target_chance(coverage: Coverage) -> tuple[str, float, float] | None:
    """The chance level of a binary cross-entropy or a mean squared error that is the loss itself, averaged (see
    :func:`neuraldbg.capture.loss_graph.loss_targets`: nothing weighted, added or masked), from its targets on the
    first backward passes, as :class:`Curve` fields: the loss of a model that learned nothing from its inputs, only
    what the targets are on average. A binary cross-entropy's is the mean binary entropy of the labels' base rates
    (each label predicted with its frequency: a multi-label classifier given shuffled labels, 0.648 against 0.651,
    log 2 = 0.693); a mean squared error's, the mean of the targets' variances per output column (each predicted
    by its mean: shuffled targets, MSE 0.461 against 0.454). Read from :data:`TARGETS_PER_COLUMN` samples per column
    or more, none of a binary cross-entropy's targets outside [0, 1], a level above zero (constant targets have
    none): (the loss's kind, "bce" or "mse"; the per-column level; the pooled one). None otherwise."""
    found, kind = coverage.target_baseline, coverage.baseline_kind
    if len(found) != 5 or kind not in BASELINES:
        return None
    rms = coverage.training.median("input_rms", 0.0, 0.25)
    if math.isfinite(rms) and rms >= RAW_INPUT_RMS:
        return None  # inputs far from unit scale: their scale, not their pairing with the targets, is the story
    level, pooled, samples, outside, _ = found
    if samples < TARGETS_PER_COLUMN or outside or not (math.isfinite(level) and math.isfinite(pooled)) or level <= 0:
        return None
    return kind, level, pooled


#: Labels counted per class, at least, before their frequencies' entropy is a chance level (it is estimated from
#: the first backward passes' labels: a handful per class would make an imbalance of chance draws).
LABELS_PER_CLASS = 10
#: The first fully observed steps whose label mix is read, and the share of their labels their top class holds on
#: average, from which their label counts are a batch's classes, not the labels' frequencies (see label_prior).
ONE_CLASS_STEPS = 4
ONE_CLASS = 0.9


def label_prior(coverage: Coverage, band: float) -> float | None:
    """The entropy of the labels' frequencies (from the ``nll_loss``'s class indices on the first backward passes,
    see :mod:`neuraldbg.capture.ledger`), when it is the chance level of the loss: the loss is that ``nll_loss``
    averaged over its labels (nothing added to it: no label smoothing, no second term, no class weights), the labels
    were counted over the classes of the model's output, :data:`LABELS_PER_CLASS` times their number or more, none
    outside them, and their entropy lies below the band around log(classes) (imbalanced classes; balanced ones keep
    log(classes)). A classifier whose inputs say nothing about the labels learns their frequencies and no more: its
    cross-entropy settles at that entropy (a character-level GRU given shuffled targets: 2.47 nats, the characters'
    unigram entropy, log 17 = 2.83), not at log(classes). None otherwise, and when the first steps' batches were
    each (almost) one class (:data:`ONE_CLASS`): their counts tell the classes those batches drew, not how often
    each class is a label (hunt 25: one utterance of one speaker per batch, the loss at 0.98 against log 6 = 1.79
    and held-out accuracy 0.77, was called at chance against the 0.565 of its first 4 batches)."""
    classes = coverage.training.classes
    if not coverage.classifier_mean or coverage.classifier_smoothed:
        return None
    first = sorted(coverage.label_steps)[:ONE_CLASS_STEPS]
    if len(first) == ONE_CLASS_STEPS and sum(share for _, _, share in first) / len(first) >= ONE_CLASS:
        return None
    if len(coverage.label_prior) != 4 or coverage.label_classes != classes:
        return None
    entropy, counted, outside, _ = coverage.label_prior
    if outside or counted < LABELS_PER_CLASS * classes or not math.isfinite(entropy) or classes < 2:
        return None
    return entropy if entropy < (1 - band) * math.log(classes) else None


def large_updates(facts: TrainingFacts, config: DebugConfig) -> str:
    """The evidence of a learning rate too high for the loss to settle, in words, or "": updates of at least
    ``loss_large_update`` of the weights' norm per step over the first quarter of the run, or weights whose norm
    grew 2.5-fold (steps too large to cancel out random-walk the weights outwards; healthy programs of the
    benchmark grow them at most 2-fold)."""
    early = facts.median("update_ratio", 0.0, 0.25)
    if math.isfinite(early) and early >= config.loss_large_update:
        return f"each update changed the weights by {num(early)} of their norm over the first quarter of the run"
    w0, w1 = facts.median("weight_norm", 0.0, 0.1), facts.median("weight_norm", 0.9, 1.0)
    if math.isfinite(w0) and math.isfinite(w1) and w0 > 0 and w1 >= WEIGHT_GROWTH * w0:
        return f"the weights' norm grew {num(w1 / w0)}-fold over the run ({num(w0)} to {num(w1)})"
    return ""


def _window(trace: LossTrace, fraction: float, offset: float = 0.0, log: bool = False) -> Stretch | None:
    """The losses of the first ``fraction`` of the run from ``offset`` (a negative fraction: the last ones), at
    least :data:`WINDOW` of them (whole blocks); ``log``: their logarithms."""
    blocks = trace.blocks
    if not blocks:
        return None
    size = max(1, trace.size)
    wanted = max(WINDOW, int(abs(fraction) * trace.count))
    count = min(len(blocks), max(1, -(-wanted // size)))
    if fraction < 0:
        return combine(blocks[-count:], log)
    first = min(int(offset * len(blocks)), len(blocks) - 1)
    return combine(blocks[first : first + count], log)


def _trained(facts: TrainingFacts, steps: int) -> float:
    """The per-step update ratios added up over the run (their mean over the observed rows, times the steps)."""
    ratios = [r.update_ratio for r in facts.rows if math.isfinite(r.update_ratio)]
    return sum(ratios) / len(ratios) * steps if ratios else math.nan


# --- the likely causes ------------------------------------------------------------------------------------


def evidence(coverage: Coverage, config: DebugConfig, curve: Curve) -> dict[str, float]:
    """The numbers the likely causes are ranked by, as an event's metrics (NaN values left out)."""
    facts = coverage.training
    values = {
        "start": curve.start.mean,
        "end": curve.end.mean,
        "noise": curve.noise,
        "losses": float(curve.losses),
        "end_from": float(curve.end.first),
        "first_loss": coverage.losses.first[0][1] if coverage.losses.first else math.nan,
        "update_early": facts.median("update_ratio", 0.0, 0.25),
        "update_late": facts.median("update_ratio", 0.75, 1.0),
        "update_median": facts.median("update_ratio"),
        "weight_start": facts.median("weight_norm", 0.0, 0.1),
        "weight_end": facts.median("weight_norm", 0.9, 1.0),
        "clip": facts.median("clip"),
        "input_rms": facts.median("input_rms", 0.0, 0.25),
        "trained": curve.trained,
        "large_update": config.loss_large_update,
        "enough_training": config.loss_trained,
        "band": config.loss_chance_band,
    }
    if curve.chance is not None:
        values.update(chance=curve.chance, classes=float(curve.classes))
    if coverage.classifier_loss or curve.chance is not None:
        values.update(classifier=1.0)  # the loss is a classifier's: its mistakes are likely causes
    if coverage.classifier_loss and coverage.activated_loss is None:
        # ... except those its graph rules out: a loss that normalises logits itself, given raw logits (no softmax,
        # ReLU or sigmoid between them: activation_before_loss would say so)
        values.update(logits_read=1.0)
    if curve.prior is not None:
        values.update(prior=curve.prior)
    if curve.baseline and not curve.at_chance_of_classes:  # a classifier's chance explains it in its own words
        values.update(
            baseline=BASELINES[curve.baseline], target_level=curve.target_level, target_pooled=curve.target_pooled
        )
    first, last = curve.second_half
    values.update(half_from=first, half_to=last, half_noise=curve.half_noise, by_factors=float(curve.by_factors))
    if curve.memorised is not None:
        values.update(curve.memorised)
    if curve.pinned is not None:
        values.update(pinned=curve.pinned)
    if curve.far_above_targets:
        values.update(far_above=curve.end.mean / curve.target_high)
    found = ungraded(coverage)
    if found:
        values.update(ungraded=float(len(found)), stepped_params=float(len(coverage.optimized)))
    return {k: float(v) for k, v in values.items() if math.isfinite(v)}


#: Fully observed steps that carried a gradient before parameters that never held one are said not to train ...
UNGRADED_STEPS = 3
#: ... and the parameters named in the words, at most (the rest counted).
UNGRADED_NAMED = 3
#: The share of the stepped parameters that never held a gradient from which that is the first likely cause of a
#: loss that does not fall (fewer may be a head computed and not used: ``BertModel``'s pooler).
UNGRADED_SHARE = 0.5


def ungraded(coverage: Coverage) -> list[str]:
    """The parameters an optimizer stepped at a learning rate above 0 (requiring a gradient) that never held one on
    a fully observed step while others did, on at least :data:`UNGRADED_STEPS` of them, in name order: layers the
    loss does not reach (run under ``torch.no_grad()``, in a reentrant checkpoint whose input needs no gradient,
    an output detached from the loss). Not a finding of its own (freezing a backbone under ``no_grad`` while the
    optimizer still holds it is common and deliberate), but a fact a loss that does not fall is explained by."""
    if coverage.graded_steps < UNGRADED_STEPS or not coverage.graded:
        return []
    return sorted(coverage.optimized - coverage.graded)


def ungraded_detail(names: list[str]) -> str:
    """The first :data:`UNGRADED_NAMED` of ``names`` quoted, and how many more: an event's ``detail``."""
    shown = ", ".join(repr(n) for n in names[:UNGRADED_NAMED])
    more = len(names) - UNGRADED_NAMED
    return shown + (f" and {count(more)} more" if more > 0 else "")


def moving(m: dict[str, float], counted: bool = True) -> str:
    """What the optimizer did, as the loss findings' words say it: that gradients flow, or, when some of the
    parameters it steps never held a gradient (see :func:`ungraded`), how many (``counted``; else only that it
    moves the weights: a likely cause after the one that counts them)."""
    if not m.get("ungraded"):
        return "the gradients flow and the optimizer moves the weights"
    if not counted:
        return "the optimizer moves the weights"
    return (
        f"the optimizer moves the weights, but {count(m['ungraded'])} of the {count(m.get('stepped_params', 0.0))} "
        "parameters it steps never held a gradient"
    )


@dataclass(frozen=True)
class Cause:
    """A likely cause of a loss that does not fall as it should: how strongly the run's evidence points at it
    (higher first), what that evidence is, and the fix."""

    weight: float
    name: str
    evidence: str
    fix: str


_LR_HIGH = "lower the learning rate (10x at a time), or add a warm-up"
#: A loss at chance whose first stretch averaged below chance by this many widths of the band of chance had learned
#: something before it rose back: not labels that never matched their inputs.
UNLEARNED = 2.0


def causes(m: dict[str, float], finding: str, detail: str = "") -> list[Cause]:
    """The likely causes of ``finding`` (``"chance"``, ``"flat"`` or ``"unstable"``), most likely first, from an
    event's metrics (:func:`evidence`): the update/weight ratio, the weights' norm, clipping, the input's scale,
    parameters no gradient reaches (named in ``detail``, the event's)."""
    found: list[Cause] = []
    # the loss graph showed a loss that normalises logits given raw logits: a classifier's loss mistakes are ruled out
    fits = m.get("logits_read") == 1.0
    cut, stepped = m.get("ungraded", 0.0), m.get("stepped_params", 0.0)
    if cut and finding != "unstable":
        named = f" ({detail})" if detail else ""
        found.append(
            Cause(
                3.5 if stepped and cut >= UNGRADED_SHARE * stepped else 1.2,
                "layers the loss does not reach",
                f"{count(cut)} of the {count(stepped)} parameters the optimizer steps never held a gradient on a fully "
                f"observed step{named}: their layers do not train (never used by the forward pass, as a positional "
                "embedding created and never added; run under torch.no_grad(), inside torch.utils.checkpoint with "
                "use_reentrant=True on an input that needs no gradient, or cut from the loss by a .detach())",
                "let the gradient reach them: use them in forward (add the embedding you built), no torch.no_grad() "
                "around layers that should train, checkpoint(..., use_reentrant=False) (or an input that requires "
                "a gradient), no .detach() before the loss; or freeze them on purpose (requires_grad_(False)) and "
                "leave them out of the optimizer",
            )
        )
    pinned = m.get("pinned")
    if pinned is not None and finding != "unstable":
        found.append(
            Cause(
                4.0,
                "an output that does not depend on the input",
                f"from step {int(m.get('end_from', 0.0))} on the loss held at {num(m.get('end', 0.0))}, spreading by "
                f"{num(pinned)} of it from batch to batch: neither what the batches hold nor what the updates change "
                "reaches it, so the model gives the same output whatever its input (a pooling that reads one fixed "
                "position for every sample, as a CLIP text tower does when its eos_token_id is not in its "
                "vocabulary; an input replaced by a constant; a mask that hides every position)",
                "check that the outputs differ across the samples of a batch (their spread along the batch "
                "dimension) and find the layer after which they stop differing: fix its pooling index, mask or "
                "configuration (eos_token_id and pad_token_id must be tokens of the vocabulary)",
            )
        )
    early, late = m.get("update_early"), m.get("update_late")
    if early is not None and early >= m.get("large_update", 0.1):
        after = f" ({num(late)} over the last)" if late is not None else ""
        found.append(
            Cause(
                3.0,
                "learning rate too high",
                f"each update changed the weights by {num(early)} of their norm over the first quarter of the "
                f"run{after}",
                _LR_HIGH,
            )
        )
    level, start = m.get("prior", m.get("chance")), m.get("start")
    if finding == "chance" and level is not None and start is not None and start < (1 - UNLEARNED * m["band"]) * level:
        found.append(
            Cause(
                3.2,
                "learning rate too high",
                f"the loss had fallen to {num(start)} over the first part of the run, well below chance, and rose "
                "back to it: training undid what it had learned (a learning rate, or a warm-up's peak, too high)",
                _LR_HIGH,
            )
        )
    w0, w1 = m.get("weight_start"), m.get("weight_end")
    if w0 and w1 is not None:
        if w1 >= WEIGHT_GROWTH * w0:
            found.append(
                Cause(
                    2.5,
                    "learning rate too high",
                    f"the weights' norm grew {num(w1 / w0)}-fold over the run ({num(w0)} to {num(w1)})",
                    _LR_HIGH,
                )
            )
        elif w1 <= 0.5 * w0:
            found.append(
                Cause(
                    2.8,
                    "weight decay too strong",
                    f"the weights shrank to {num(w1 / w0)} of their norm ({num(w0)} to {num(w1)}) while the loss did "
                    "not fall: the decay outweighs the gradient",
                    "lower the weight decay (1e-4 to 1e-2 is usual for AdamW, 5e-4 for SGD)",
                )
            )
    clip = m.get("clip")
    if clip is not None and clip >= TINY_CLIP:
        found.append(
            Cause(
                2.9,
                "gradient clipping to a tiny norm",
                f"clipping made the gradients {num(clip)} times smaller than the backward pass left them",
                "raise the clipping's threshold (max_norm of clip_grad_norm_, 1.0 is usual, or clip_value of "
                "clip_grad_value_) or remove the clipping",
            )
        )
    trained = m.get("trained")
    # a loss held still batch after batch is not one the updates were too small to move
    if trained is not None and trained < m.get("enough_training", 1.0) and finding != "unstable" and pinned is None:
        per_step = f" (update/weight ratio {num(m['update_median'])} per step)" if "update_median" in m else ""
        found.append(
            Cause(
                2.7,
                "learning rate too low",
                f"the updates of the whole run added up to {num(trained)} of the weights' norm{per_step}",
                "raise the learning rate (10x at a time), or train for more steps",
            )
        )
    rms = m.get("input_rms")
    if rms is not None and rms >= 10:
        found.append(
            Cause(
                1.5,
                "inputs not normalised",
                f"the input batch's root-mean-square is {num(rms)} (normalised data is about 1; 0-255 pixels give "
                "about 100)",
                "normalise the inputs (ToTensor() scales pixels to 0-1, then Normalize(mean, std))",
            )
        )
    if finding == "flat":  # beside a loss that does not fit the output (below): the two faults no gradient shows
        found.append(
            Cause(
                0.9,
                "targets that do not match the inputs",
                f"{moving(m, counted=False)}, yet the loss does not fall: when nothing in "
                "the inputs predicts the targets, the fit cannot improve on where it began",
                "check that inputs and targets are shuffled together (one permutation, or a Dataset of pairs) and "
                "aligned the same way; look at a few (input, target) pairs",
            )
        )
    if finding == "chance" and "far_above" in m:
        start, level = m.get("start", 0.0), max(m.get("target_level", 0.0), m.get("target_pooled", 0.0))
        began = f"it began at {num(start / level)} times the variance" if level > 0 else "it began far above it"
        found.append(
            Cause(
                3.0,
                "outputs and targets on different scales",
                f"{began}: the outputs started far from the targets, and steps of the learning rate's size move "
                "them there slowly (targets not standardised, weights initialised far too large, an output scaled "
                "by a constant)",
                "standardise the targets (subtract their mean, divide by their standard deviation, and undo it on "
                "the predictions) or start the last layer's bias at their mean; if the layers' outputs are the large "
                "ones, keep PyTorch's default initialisation (or Kaiming / Xavier)",
            )
        )
    elif finding == "chance" and m.get("baseline") == BASELINES["mse"]:
        found.append(
            Cause(
                2.0,
                "targets that do not match the inputs",
                f"{moving(m, counted=False)}, yet the predictions explain none of the "
                "targets' variance: nothing in the inputs predicts the targets",
                "check that inputs and targets are shuffled together (one permutation, or a Dataset of pairs) and "
                "aligned the same way (rows, time steps); look at a few (input, target) pairs",
            )
        )
        found.append(
            Cause(
                1.0,
                "a loss that does not fit the output",
                "a prediction compared with the wrong target (another column, another time step) or inputs that do "
                "not reach the output also keep the error at the variance",
                "check which target each output is compared with, and that the inputs the targets depend on are fed",
            )
        )
    elif finding == "chance" and m.get("baseline") == BASELINES["bce"]:
        found.append(
            Cause(
                2.0,
                "labels that do not match the inputs",
                f"{moving(m, counted=False)}, yet the predictions stay the labels' base "
                "rates: nothing in the inputs predicts the labels",
                "check that inputs and labels are shuffled together (one permutation, or a Dataset of pairs) and "
                "decoded the same way (label columns in the same order); look at a few (input, label) pairs",
            )
        )
        if not fits:
            found.append(
                Cause(
                    1.0,
                    "a loss that does not fit the output",
                    "a sigmoid before binary_cross_entropy_with_logits (which applies it itself) or targets of the "
                    "wrong kind also keep a loss near chance",
                    "give BCEWithLogitsLoss the raw logits and 0/1 float targets; use binary_cross_entropy only after "
                    "a sigmoid",
                )
            )
    elif finding == "chance":
        if "new_loss" in m:
            found.append(
                Cause(
                    3.0,
                    "labels that do not match the inputs",
                    f"on the samples it had never seen it predicted no better than a guess ({num(m['new_loss'])} over "
                    f"{count(m.get('new_samples', 0.0))} of them), on those it saw again, at the same steps, it did "
                    f"({num(m.get('seen_loss', 0.0))}): it memorises the labels it is shown and cannot predict them "
                    "from the inputs",
                    "check that inputs and labels are shuffled together (one permutation, or a Dataset of pairs) and "
                    "decoded the same way; look at a few (input, label) pairs",
                )
            )
        found.append(
            Cause(
                2.0,
                "labels that do not match the inputs",
                f"{moving(m, counted=False)}, yet the predictions stay a guess: nothing "
                "in the inputs predicts the labels",
                "check that inputs and labels are shuffled together (one permutation, or a Dataset of pairs) and "
                "decoded the same way; look at a few (input, label) pairs",
            )
        )
        if not fits:
            found.append(
                Cause(
                    1.0,
                    "a loss that does not fit the output",
                    "softmax before CrossEntropyLoss (which applies log_softmax itself) or a target of the wrong kind "
                    "also keep a loss near chance",
                    "give CrossEntropyLoss the raw logits and class indices; use nll_loss only after log_softmax",
                )
            )
    elif "classifier" in m:
        if not fits:
            found.append(
                Cause(
                    0.8,
                    "a loss that does not fit the output",
                    "a loss whose gradient does not lead to the target: softmax before CrossEntropyLoss, nll_loss on "
                    "raw logits, MSE on class indices",
                    "give CrossEntropyLoss the raw logits and class indices, nll_loss only log-probabilities, MSE only "
                    "continuous targets",
                )
            )
    else:  # a regression's, a reconstruction's or another objective's: the classifier's mistakes do not apply
        found.append(
            Cause(
                0.8,
                "a loss that does not fit the output",
                "a loss whose gradient does not lead to the target: targets the output cannot reach (a final sigmoid "
                "or tanh before targets outside its range), a term with the wrong sign, or one that undoes the others",
                "check the output's range against the targets', the sign of each term, and each term of a loss made "
                "of several on its own",
            )
        )
    best: dict[str, Cause] = {}
    for cause in found:
        if cause.name not in best or cause.weight > best[cause.name].weight:
            best[cause.name] = cause
    return sorted(best.values(), key=lambda c: -c.weight)


#: What to do about a loss finding when none of the likely causes applies to the run (a classifier fed its raw logits
#: whose loss climbed under updates of ordinary size): where to look next, never an empty fix.
UNRANKED_FIX = {
    "unstable": (
        "log each term of the loss on its own and check its sign and what it is compared with: a target the model "
        "computes itself (an EMA teacher, a momentum encoder) must not receive gradients (detach it, or compute it "
        "under torch.no_grad()); if every term is right, lower the learning rate"
    ),
    "flat": (
        "check that the loss is computed from the model's output and the right targets, and that each term of it "
        "reaches the parameters (log each term on its own); then try a larger learning rate"
    ),
    "chance": (
        "check that inputs and labels are shuffled together and decoded the same way; look at a few (input, label) "
        "pairs"
    ),
}


def ranked(m: dict[str, float], finding: str, limit: int = 3, detail: str = "") -> tuple[str, str]:
    """The likely causes in words, most likely first, and the fix of the first (``detail``: the event's); when no
    cause applies, no words and the finding's :data:`UNRANKED_FIX`."""
    found = causes(m, finding, detail)
    if not found:
        return "", UNRANKED_FIX[finding]
    parts = [f"({i}) {c.name}: {c.evidence}" for i, c in enumerate(found[:limit], 1)]
    return " Likely causes, most likely first: " + "; ".join(parts) + ".", found[0].fix


class LossKind(Kind):
    """What the loss-level rooms share: a run-level symptom of the loss, found when :func:`finding` gives the
    room's name, its event holding the :func:`evidence`, ranked after every fault in the order ``loss_order``."""

    run_level = True
    loss_symptom = True
    #: Its place among the loss findings (in the last root lane).
    loss_order = 0

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        found = finding(coverage, facts.config)
        if found is None or found[0] != self.name:
            return None
        curve = found[1]
        return self.event(curve, evidence(coverage, facts.config, curve), ungraded_detail(ungraded(coverage)))

    def event(self, curve: Curve, metrics: dict[str, float], detail: str = "") -> SemanticEvent:
        """The room's event for ``curve`` (a room adds its own metrics or detail here; ``detail``: the parameters
        no gradient reached, see :func:`ungraded_detail`)."""
        return run_event(self.kind, curve.start.first, curve.end.last, detail, **metrics)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(LAST_RANK, order=self.loss_order)

    def place(self, event: SemanticEvent) -> str:
        return "the loss"
