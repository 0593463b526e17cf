"""What was observed of a run: the counts a verdict of "healthy" needs.

The hooks count what they saw (forward passes of the model in and out of training, backward passes, forwards in
eval mode, the debugger's own failures and what it had to skip); the analysis counts, per observed step, whether a
gradient reached the parameters and whether the loss gave any; under a GradScaler, :class:`ScalerCounts` follows
the steps it skipped and its scale. The run-level kinds (:mod:`neuraldbg.kinds`) judge these counts: no training
step observed, no gradient, training in eval mode, a degenerate loss, a collapsing loss scale, an incomplete
observation. Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..config import DebugConfig
from ..stats.history import History, Series
from ..stats.losses import LossTrace
from ..stats.outputs import OutputScales
from ..stats.samples import SampleRepeats
from ..stats.step import StepData
from ..stats.training import TrainingFacts

#: Steps that add up the same number of backward passes before a step of fewer is taken for a partial one.
PARTIAL_AFTER = 4
#: The trailing window the scale-collapse rule looks at: a default GradScaler (initial scale 2**16, backoff 0.5)
#: that skips every step falls to a scale of 1 within these 16 steps.
SCALE_WINDOW = 16
#: A scale the scaler backed off below this shrinks the loss instead of scaling it up: even unscaled, the float16
#: gradients overflowed (or were NaN, which no scale fixes). Healthy float16 runs keep scales of about 2**8 to 2**24.
SCALE_FLOOR = 1.0
#: The first gradient readings of a run: a loss whose gradient is exactly zero on most of them gave none from the
#: start (a fit that converged to an exact zero, a margin loss, had gradients first).
EARLY_READINGS = 8
#: The weight of each new reading in the running mean of the losses of readings with a gradient (about the last 20).
GIVEN_PACE = 0.05
#: Skipped steps whose numbers are kept to show (the count is exact).
#: Fully observed steps whose label mix is kept (see capture/label_mix.py).
LABEL_STEPS = 1024
#: Fully observed steps whose data is profiled against a bounded source's range, kept (see forward._note_source).
INPUT_RANGES = 64
_SHOWN_SKIPS = 20


@dataclass
class ScalerCounts:
    """What a GradScaler did over the observed steps: skips and its scale."""

    steps: int = 0  # observed steps under an active scaler
    skipped: int = 0
    first_skipped: list[int] = field(default_factory=list)  # the first step numbers skipped (at most 20)
    recent: deque[tuple[int, bool]] = field(default_factory=lambda: deque(maxlen=SCALE_WINDOW))
    applied: int = 0  # steps the optimizer took
    streak: int = 0  # skipped steps in a row, up to the last observed step
    streak_start: int = -1
    streak_end: int = -1
    streak_in_training: bool = False  # the streak began after the optimizer had taken a step
    collapse: tuple[int, int, int] | None = None  # (first, last, length) of the longest such streak, ended
    first_scale: tuple[int, float] | None = None
    last_scale: tuple[int, float] | None = None
    min_scale: tuple[int, float] | None = None
    below_floor: tuple[int, int] | None = None  # (first, last) step with a scale under SCALE_FLOOR

    def observe(self, record: StepData) -> None:
        step = record.step
        self.steps += 1
        self.recent.append((step, record.skipped))
        if record.skipped:
            self.skipped += 1
            if len(self.first_skipped) < _SHOWN_SKIPS:
                self.first_skipped.append(step)
            if self.streak == 0:
                self.streak_start = step
                self.streak_in_training = self.applied > 0
            self.streak += 1
            self.streak_end = step
        else:
            self._end_streak()
            self.applied += 1
        scale = record.loss_scale
        if scale is not None and math.isfinite(scale):
            self.first_scale = self.first_scale or (step, scale)
            self.last_scale = (step, scale)
            if self.min_scale is None or scale < self.min_scale[1]:
                self.min_scale = (step, scale)
            if scale < SCALE_FLOOR and scale < self.first_scale[1]:  # backed off there (not a scale set so low)
                self.below_floor = (self.below_floor[0] if self.below_floor else step, step)

    def _end_streak(self) -> None:
        longer = self.collapse is None or self.streak > self.collapse[2]
        if self.streak >= SCALE_WINDOW and self.streak_in_training and longer:
            self.collapse = (self.streak_start, self.streak_end, self.streak)
        self.streak = 0

    def facts(self) -> dict[str, float | int | list[int]]:
        """The counts as meta data (``dbg.meta["grad_scaler"]``)."""
        out: dict[str, float | int | list[int]] = {
            "steps": self.steps,
            "skipped_steps": self.skipped,
            "first_skipped_steps": list(self.first_skipped),
        }
        for key, value in (
            ("first_scale", self.first_scale),
            ("last_scale", self.last_scale),
            ("min_scale", self.min_scale),
        ):
            if value is not None:
                out[key] = value[1]
        return out


@dataclass
class Coverage:
    """What was observed of a run; see the module docstring."""

    mode_dependent: list[str] = field(default_factory=list)
    heavy_dropout: list[tuple[str, float]] = field(default_factory=list)  # (layer, p): dropout of p >= HEAVY
    # counted by the hooks
    forwards: int = 0  # training forward passes (gradients enabled, training thread), compiled ones included
    no_grad_forwards: int = 0  # forwards of the model under no_grad / inference_mode
    other_thread_forwards: int = 0  # forwards of the model from another thread (never recorded)
    transformed_forwards: int = 0  # forwards of the model inside torch.func transforms (vmap, grad: not measured)
    eval_forwards: int = 0  # eval-mode forwards not followed by a backward pass (validation)
    eval_steps: list[int] = field(default_factory=list)  # steps trained with the model in eval mode
    failures: list[tuple[int, str]] = field(default_factory=list)  # (step, what failed) of the debugger itself
    skipped: dict[str, str] = field(default_factory=dict)  # parameter -> why its gradient could not be read
    first_skip: int = -1
    # counted by the analysis
    steps: int = 0
    full_steps: int = 0
    last_full_step: int = -1  # the last fully observed step that was not skipped
    steps_with_gradient: int = 0  # a parameter gradient was present
    steps_with_nonzero_gradient: int = 0  # ... and not exactly zero everywhere
    loss_gradient_readings: int = 0  # full steps where the loss gradient w.r.t. the output was read
    zero_loss_gradient: int = 0  # ... and it was exactly zero
    last_loss: float | None = None
    last_step: int = -1
    scaler: ScalerCounts | None = None  # under a GradScaler: its skipped steps and scale
    # exactly-zero gradients, on every step where the gradient was read (fully observed steps: every parameter's;
    # cheap steps: the head layer's gradient on a CPU, the loss gradient on a GPU)
    gradient_readings: int = 0
    zero_gradient_readings: int = 0
    early_zero_readings: int = 0  # ... among the first EARLY_READINGS readings
    zero_steps: tuple[int, int] | None = None  # (first, last) step with an exactly-zero gradient
    # readings not exactly zero after the first one that was, and the last step of one: a margin loss met on most
    # batches still has gradients from its hard ones; a policy made deterministic has none again
    nonzero_after_zero: int = 0
    last_nonzero_step: int = -1
    # the losses of the readings that had a gradient: the first ones, and a running mean of the latest (a margin met
    # by learning leaves the hard batches' losses small; batches that give nothing leave the others as they were)
    given_first: list[float] = field(default_factory=list)
    given_recent: float = math.nan
    # gradients carried over from the previous optimizer step (optimizer.zero_grad() missing)
    carried_steps: int = 0
    carried_span: tuple[int, int] | None = None
    carried_params: tuple[str, ...] = ()
    carried_by: str = ""
    stepped_steps: int = 0  # steps on which an owned optimizer stepped (the occasions for a carry-over)
    # the whole model is one affine map (capture/affine.py): the layers composed, over every check (None: no check
    # found it, or one found a node that is not linear in the data)
    affine_layers: int | None = None
    _not_affine: bool = False
    # ... or, in a model that is not, two weight layers composed with nothing nonlinear between them: (lower, upper)
    linear_pairs: set[tuple[str, str]] = field(default_factory=set)
    # an activation layer (ReLU family, tanh, sigmoid) ran on a fully observed step, its units read: nonlinear work
    # that a graph found affine does not hold (it ran on data without a gradient: a frozen backbone's activations)
    activation_ran: bool = False
    # layers whose output units started identical and had not parted while their weights moved (capture/symmetry.py),
    # as of the last step that checked: layer -> (units, first step seen, last step seen, steps seen, last spread)
    symmetric: dict[str, tuple[int, int, int, int, float]] = field(default_factory=dict)
    zero_started: set[str] = field(default_factory=set)  # ... those that started at zero (their units move as one)
    # what makes one loss curve meaningless: several objectives
    foreign_optimizer_steps: int = 0  # steps of optimizers that hold none of the watched parameters
    # parameters that changed out of sight (an optimizer step after the `with dbg:` block, or in a block of its own),
    # with the last step each was seen changed at and the most steps between two of its changes: the updates
    # measured for them read zero
    moved_unseen: dict[str, tuple[int, int]] = field(default_factory=dict)
    last_unseen_move: int = -1  # ... the last step any of them was seen changed at
    # backward passes that reached the model between owned optimizer steps (outside closures, see capture.ledger),
    # those that threw away the gradient of an earlier one that no step had applied, and the step of the first such
    optimizer_backwards: int = 0
    discarded_backwards: int = 0
    first_discarded: int = -1
    # owned optimizer steps taken by an optimizer with no state before them that kept per-parameter state after them
    # (a momentum buffer, moment estimates): one made anew, or cleared, for that step (kinds/optimizer_reset.py); the
    # first such step after the run's first one, and what the last one kept: its class, its state's entries, the
    # momentum of its first group (NaN: none)
    reset_steps: int = 0
    first_reset: int = -1
    reset_optimizer: str = ""
    reset_state: tuple[str, ...] = ()
    reset_momentum: float = math.nan
    # owned optimizer steps that closed a stretch of backward passes reaching the model (several optimizers stepping
    # together close one), and those whose stretch threw a gradient away
    step_intervals: int = 0
    discarding_intervals: int = 0
    handed_steps: int = 0  # optimizer steps after a backward pass reached parameters they own
    forward_before_step: int = 0  # ... that came after a forward pass of the model since that backward pass
    cleared_steps: int = 0  # ... that found those parameters' gradients reset to None (see capture.ledger)
    first_cleared: int = -1  # the first such step
    left_readings: int = 0  # fully observed optimizer steps after a backward pass left gradients on its parameters
    zeroed_steps: int = 0  # ... whose gradients, not all zero at its end, were zeroed in place before the step
    first_zeroed: int = -1
    optimizer_changes: int = 0  # steps stepped by another set of owned optimizers than the step before
    optimizers_at_once: int = 0  # the most owned optimizers that stepped in one step
    # modules given a requires_grad attribute of their own (capture/switches.py), as the last fully observed pass
    # found them: name -> (the value set, its parameters that require a gradient, by qualified name, how many
    # parameters it holds, first step seen)
    switches: dict[str, tuple[bool, tuple[str, ...], int, int]] = field(default_factory=dict)
    _optimizers: frozenset[int] = frozenset()
    size_changes: int = 0  # steps whose input batch, or number of forward passes, differed from the step before
    # (RL episodes of different lengths)
    _input_numel: int = 0
    _forwards: int = 0
    warm_start: bool = False  # the optimizer had state before the first observed step (its record says so)
    # an activation between the logits and a loss that normalises them itself (capture/loss_graph.py):
    # (activation, loss, layer, step), layer "" when no watched layer's output is it or its input
    activated_loss: tuple[str, str, str, int] | None = None
    # a binary cross-entropy on a softmax's output (the layer whose output the softmax took, the step it was first
    # seen at), and the most positive labels its targets held per row, on average, on one backward pass
    softmax_bce: tuple[str, int] | None = None
    softmax_positives: float = 0.0
    # the largest rate of a dropout the forward code applied itself, read from the loss's graph (dropout_graph.py)
    graph_dropout: float = 0.0
    # a loss that compared each sample's prediction with other samples' targets (capture/loss_graph.py: crossed):
    # (what compared them, the prediction's shape, the shape compared, the layer whose output it is, step)
    crossed_loss: tuple[str, tuple[int, ...], tuple[int, ...], str, int] | None = None
    # a loss that weighs a log-probability by a difference carrying a gradient to parameters the log-probability does
    # not use (an advantage ``R - value`` not detached): the layers that hold them (none when no watched layer does)
    # and the step first seen
    undetached: tuple[tuple[str, ...], int] | None = None
    # the loss holds a policy-gradient term (log-probabilities of picked actions weighed per sample): a surrogate,
    # which rises as the returns grow (capture/loss_graph.py: weighs_log_probabilities)
    policy_gradient: bool = False
    # ... or a term that may be one: picked log-probabilities weighed by a constant never negative so far (returns
    # before a critic learned, or class weights under a hand-written cross-entropy): looked at again on full steps
    policy_candidate: bool = False
    classifier_loss: str = ""  # the loss normalises logits itself (cross_entropy, ...): the model is a classifier
    # the loss marginalises a log_softmax's output with a logsumexp (a mixture's weights: a mixture density network),
    # holding no classifier's log-probabilities (capture/loss_graph.py: read)
    mixture_loss: bool = False
    # the profile of a mean squared error's target on one value per sample over the first backward passes
    # (capture/loss_graph.py): (all integers 1.0/0.0, smallest, largest, mean variance); () when no such loss
    regression_target: tuple[float, ...] = ()
    _regression_profiles: int = 0
    # ... when that target was broadcast across several outputs of each sample (logits given class indices):
    # (outputs per sample, the layer whose output the prediction is, "" when not known, step first seen)
    repeated_target: tuple[int, str, int] | None = None
    # a causal LM that shifts its labels itself, given labels that already are the next input token: the largest
    # share of such labels over the first forward passes (None: not a causal LM given input_ids and labels)
    labels_ahead: float | None = None
    labels_ahead_step: int = 0
    # a model whose attention ran with no mask over its tokens: each reading of how much its loss is a next-token
    # objective over its own input, (step, share) (kinds/missing_causal_mask.py)
    next_token: list[tuple[int, float]] = field(default_factory=list)
    # ... the largest share of the labels it scores that sit where its attention mask hides the input (padding), and
    # the step of the first reading (None: no attention mask given with them)
    scored_padding: float | None = None
    scored_padding_step: int = 0
    # padding masks read against the token input on fully observed steps, by source ("": the model's
    # attention_mask argument; else an attention layer's key_padding_mask): [steps read, steps on which the mask hid
    # the real tokens and showed the padding or hid every position, the first such step, steps on which it hid every
    # position]
    inverted_masks: dict[str, list[int]] = field(default_factory=dict)
    # which input samples the model saw before, and its loss on them (see stats.samples)
    repeats: SampleRepeats = field(default_factory=SampleRepeats)
    first_loss_terms: int = 1  # the backward passes whose losses the first recorded loss adds up
    # how many recorded losses added up each number of backward passes (see partial_loss)
    loss_term_counts: dict[int, int] = field(default_factory=dict)
    partial_losses: int = 0  # losses left out of the trace as partial (see partial_loss)
    _usual_terms: int | None = field(default=None, repr=False)  # the most frequent of loss_term_counts (None: none)
    # an nll_loss given values that no log_softmax produced: the largest |logsumexp| of its input's rows over the
    # first backward passes (0 for log-probabilities; None: no such loss), the step first read, and the layer
    # whose output the input is ("" when no watched layer's)
    # a loss by value on the output of a bounded activation: (activation, low, high, layer) and, over the first
    # backward passes, the reading with the largest share of targets out of its reach: (share, least MSE, variance)
    bounded_output: tuple[str, float, float, str] | None = None
    # a module (the model itself included) given a bounded activation's output on training passes (another model's:
    # a generator's images given to a discriminator) and data without a graph on others: (activation, low, high, the
    # layer whose output it was, "" when no watched layer's, whether that layer is another debugger's model's); and,
    # per fully observed step, the profile of that step's data with the largest share out of the range: (step, share,
    # least MSE, variance)
    bounded_input: tuple[str, float, float, str, bool] | None = None
    input_ranges: list[tuple[int, float, float, float]] = field(default_factory=list)
    target_range: tuple[float, ...] = ()
    target_range_step: int = 0
    log_prob_gap: float | None = None
    log_prob_step: int = 0
    # a binary_cross_entropy given a clamp's output: the largest share of the clamp's input outside [0, 1] over the
    # first backward passes (None: no such loss), the step first read, and the layer whose output the clamp was given
    clamped_outside: float | None = None
    clamped_step: int = 0
    clamped_layer: str = ""
    # the labels of an nll_loss over the first backward passes (capture/ledger.py): (entropy of their frequencies,
    # labels counted, labels outside the classes, the most frequent class's share), the reading that counted the
    # most; and the number of classes
    label_prior: tuple[float, ...] = ()
    label_classes: int = 0
    # how mixed each fully observed step's labels were (capture/label_mix.py): (step, its most frequent class, that
    # class's share), for the steps that held enough labels, the first LABEL_STEPS of them
    label_steps: list[tuple[int, int, float]] = field(default_factory=list)
    # the classes an nll_loss of one row per sample chose among on its first backward passes: the most finite entries
    # of a row, on average (0: not read)
    loss_options: float = 0.0
    # a binary cross-entropy's or a mean squared error's chance level from its targets over the first backward
    # passes (capture/ledger.py): (per column, pooled, samples per column, values outside [0, 1] or not finite), the
    # reading that counted the most; and the loss's kind ("bce", "mse")
    target_baseline: tuple[float, ...] = ()
    baseline_kind: str = ""
    nll_layer: str = ""
    nll_loss: str = "nll_loss"  # the loss given values that may not be log-probabilities: nll_loss or ctc_loss
    nll_dim: int = -1  # ... the dimension a log_softmax normalised instead of the classes' (-1: no log_softmax)
    classifier_mean: bool = False  # ... and averages over its samples (its value is one sample's loss)
    classifier_cosine: bool = False  # ... and its logits are cosine similarities times a scale (ArcFace, CLIP)
    classifier_smoothed: bool = False  # ... and it is label-smoothed (cross_entropy's label_smoothing)
    # attention over padding: the token id the loss ignores (its ignore_index), the fully observed steps whose
    # integer input was read for it and those that held it, and the attention layers' calls without any mask
    padding_id: int | None = None
    token_steps: int = 0
    padded_steps: int = 0
    unmasked_attention: dict[str, int] = field(default_factory=dict)
    uncausal_attention: dict[str, int] = field(default_factory=dict)  # ... with no attention mask, not causal
    # ... of those, the attentions written by hand whose softmax ran over the queries' axis (capture/attention_graph.py)
    query_softmax: set[str] = field(default_factory=set)
    # views that mix samples (see capture/sample_views.py): the fully observed passes read, and by the layer whose
    # output was reshaped, [the shape given, the shape made, the passes it was met on, the first step]
    view_passes: int = 0
    mixed_views: dict[str, tuple[tuple[int, ...], tuple[int, ...], int, int]] = field(default_factory=dict)
    # attention layouts judged against the samples the loss scores (see note_layouts), by attention layer: [passes
    # judged, passes whose sequence axis held the samples, the first such step, the samples, the batch axis's length,
    # batch_first]
    batch_attention: dict[str, list[int]] = field(default_factory=dict)
    recurrent: set[str] = field(default_factory=set)  # ... those layers that are recurrent (any nn.RNNBase)
    # a graph cut between two watched layers: (the layer whose output was detached, the layer given it) -> the fully
    # observed forward passes that showed it; the forward order of the layers when it was first seen
    cuts: dict[tuple[str, str], int] = field(default_factory=dict)
    cut_step: int = -1
    layer_order: tuple[str, ...] = ()
    # parallel copies of a block (capture/branches.py): each copy's root -> its family, as the fully observed passes
    # that looked found them (experts of a densely computed mixture given the same tensor)
    parallel: dict[str, str] = field(default_factory=dict)
    graded: set[str] = field(default_factory=set)  # parameters that held a gradient on a fully observed step
    graded_steps: int = 0  # fully observed steps on which some parameter held one
    optimized: set[str] = field(default_factory=set)  # ... that an optimizer stepped with a learning rate above 0
    input_layer_normalizes: bool = False  # the first layer the input meets is a normalisation layer
    # the owned optimizers' weight decay (capture/ledger.py), each time it changed: (the step from which it held,
    # the largest weight_decay of a group holding watched parameters, scaled by that group's learning rate over the
    # largest one's, whether it is decoupled as AdamW's); at most ledger.DECAY_CHANGES entries
    weight_decay: list[tuple[int, float, bool]] = field(default_factory=list)
    losses: LossTrace = field(default_factory=LossTrace)  # the loss of each step (observe_loss or recorded)
    training: TrainingFacts = field(default_factory=TrainingFacts)  # update ratios, weights, inputs, ...
    outputs: OutputScales = field(default_factory=OutputScales)  # each layer's output scale over the run

    def _profile(self, found: list[float]) -> None:
        """Merge one profile of a regression target: integers only if all were, the widest range, the mean of
        the variances (one batch's variance is a noisy estimate of the target's)."""
        n = self._regression_profiles
        if not n:
            self.regression_target = tuple(found)
        else:
            integer, low, high, variance = self.regression_target
            self.regression_target = (
                min(integer, found[0]),
                min(low, found[1]),
                max(high, found[2]),
                (variance * n + found[3]) / (n + 1),
            )
        self._regression_profiles = n + 1

    def partial_loss(self, terms: int) -> bool:
        """Whether a step's loss, the sum of ``terms`` backward passes' losses, holds only part of a step's: fewer
        passes than most steps so far, which add up several (gradient accumulation). Lightning steps the optimizer
        at an epoch's end on the micro-batches left, each loss still divided by ``accumulate_grad_batches``: 125
        micro-batches of 16 accumulated by 4 end each epoch on a step of one, recorded at a quarter of the loss
        (0.32 among losses of 1.3), which would drag the loss curve's windows and inflate its spread."""
        usual = self._usual_terms
        return usual is not None and usual > 1 and terms < usual and self.loss_term_counts[usual] >= PARTIAL_AFTER

    def _count_terms(self, terms: int) -> None:
        """One more recorded loss of ``terms`` backward passes; the most frequent count so far follows it (the larger
        count of passes among the most frequent; what :meth:`partial_loss` compares with, kept as the counts grow
        instead of looked for at every step)."""
        counts = self.loss_term_counts
        n = counts[terms] = counts.get(terms, 0) + 1
        usual = self._usual_terms
        if usual is None or (n, terms) > (counts[usual], usual):
            self._usual_terms = terms

    def observe(self, record: StepData) -> None:
        """Count one analysed step."""
        self.steps += 1
        self.last_step = max(self.last_step, record.step)
        self.warm_start = self.warm_start or record.warm_start
        if record.loss is not None:
            self.last_loss = record.loss
            if not self.losses.count and math.isfinite(record.loss):
                self.first_loss_terms = record.loss_terms
            if self.partial_loss(record.loss_terms):
                self.partial_losses += 1
            else:
                self.losses.add(record.step, record.loss)
            self._count_terms(record.loss_terms)
        if record.samples:
            self.repeats.observe(record.step, record.samples, record.sample_losses, record.sample_hits)
        if (
            record.regression_target
            or record.target_range
            or record.input_range
            or record.label_prior
            or record.label_steps
            or record.target_baseline
            or record.loss_options is not None
            or record.softmax_positives is not None
            or record.graph_dropout is not None
            or record.log_prob_gap is not None
            or record.clamped_outside is not None
            or record.next_token is not None
            or record.labels_ahead is not None
            or record.inverted_masks
            or record.scored_padding is not None
        ):  # one test for the readings a few steps file (most steps file none)
            self._readings(record)
        changed = False
        if record.input_numel:
            changed = bool(self._input_numel) and record.input_numel != self._input_numel
            self._input_numel = record.input_numel
        if record.forwards:
            changed = changed or (bool(self._forwards) and record.forwards != self._forwards)
            self._forwards = record.forwards
        self.size_changes += changed
        if record.optimizers:
            self.stepped_steps += 1
            stepped = frozenset(record.optimizers)
            self.optimizers_at_once = max(self.optimizers_at_once, len(stepped))
            self.optimizer_changes += bool(self._optimizers) and stepped != self._optimizers
            self._optimizers = stepped
        if record.carried and (record.grad_carried is None or record.grad_carried > 0):
            self.carried_steps += 1
            self.carried_span = (self.carried_span or (record.step, record.step))[0], record.step
            self.carried_params = self.carried_params or record.carried
            self.carried_by = self.carried_by or record.carried_by
        if record.symmetric is not None:
            self._symmetric(record.step, record.symmetric)
        if record.skipped or record.loss_scale is not None:
            if self.scaler is None:
                self.scaler = ScalerCounts()
            self.scaler.observe(record)
        if record.skipped:  # the scaler dropped this step's gradients: no evidence about them either way
            return
        if record.full:
            self.full_steps += 1
            self.last_full_step = record.step
            self.training.observe(record)
            self.outputs.observe(record)
            self.activation_ran = self.activation_ran or bool(record.dead or record.saturated)
            if record.padded is not None:
                self.token_steps += 1
                self.padded_steps += record.padded
            if record.stepped:
                self.optimized.update(name for name, lr in record.stepped.items() if lr > 0)
            if record.grad_left is not None and record.grad_left > 0 and record.grad_kept == 0.0:
                self.zeroed_steps += 1
                if self.first_zeroed < 0:
                    self.first_zeroed = record.step
            if record.grad:
                self.graded.update(record.grad)
                self.graded_steps += 1
                self.steps_with_gradient += 1
                all_zero = all(v == 0.0 for v in record.grad.values())
                self.steps_with_nonzero_gradient += not all_zero
                # the loss gave nothing: every parameter's gradient and (when read) the output's are exactly zero
                self._zero_reading(record.step, all_zero and record.target_grad in (None, 0.0), record.loss)
            if record.target_grad is not None:
                self.loss_gradient_readings += 1
                self.zero_loss_gradient += record.target_grad == 0.0
            return
        # a cheap step: the head layer's gradient (CPU) or the loss gradient (GPU), when read
        zero: bool | None = record.head_zero
        if zero is None and record.target_grad is not None:
            zero = record.target_grad == 0.0
        if zero is not None:
            if record.head_zero is not None:  # a parameter's gradient was read (the output's says nothing of them)
                self.steps_with_gradient += 1
                self.steps_with_nonzero_gradient += not zero
            self._zero_reading(record.step, zero, record.loss)

    def _readings(self, record: StepData) -> None:
        """The readings of the loss, the targets and the inputs that some steps file (see :meth:`observe`)."""
        if len(record.regression_target) == 4:
            self._profile(record.regression_target)
        if len(record.target_range) == 3 and (not self.target_range or record.target_range[0] > self.target_range[0]):
            if not self.target_range:
                self.target_range_step = record.step  # the first reading
            self.target_range = (record.target_range[0], record.target_range[1], record.target_range[2])
        profiles = [p for p in record.input_range if len(p) == 3]
        if profiles and len(self.input_ranges) < INPUT_RANGES:
            share, floor, variance = max(profiles)
            self.input_ranges.append((record.step, share, floor, variance))
        if len(record.label_prior) == 4 and (not self.label_prior or record.label_prior[1] >= self.label_prior[1]):
            self.label_prior, self.label_classes = tuple(record.label_prior), record.label_classes
        for reading in record.label_steps:
            if len(reading) == 4 and reading[3] > 0 and len(self.label_steps) < LABEL_STEPS:
                self.label_steps.append((int(reading[0]), int(reading[1]), reading[2]))
        found = record.target_baseline
        if len(found) == 5 and (not self.target_baseline or found[2] >= self.target_baseline[2]):
            self.target_baseline, self.baseline_kind = tuple(found), record.baseline_kind
        if record.loss_options is not None:
            self.loss_options = max(self.loss_options, record.loss_options)
        if record.softmax_positives is not None:
            self.softmax_positives = max(self.softmax_positives, record.softmax_positives)
        if record.graph_dropout is not None and math.isfinite(record.graph_dropout):
            self.graph_dropout = max(self.graph_dropout, record.graph_dropout)
        if record.log_prob_gap is not None:
            if self.log_prob_gap is None:
                self.log_prob_step = record.step
            self.log_prob_gap = max(record.log_prob_gap, self.log_prob_gap or 0.0)
        if record.clamped_outside is not None:
            if self.clamped_outside is None:
                self.clamped_step = record.step
            self.clamped_outside = max(record.clamped_outside, self.clamped_outside or 0.0)
        if record.next_token is not None:
            self.next_token.append((record.step, record.next_token))
        if record.labels_ahead is not None and (self.labels_ahead is None or record.labels_ahead > self.labels_ahead):
            self.labels_ahead, self.labels_ahead_step = record.labels_ahead, record.step
        for source, inverted in record.inverted_masks.items():
            counts = self.inverted_masks.setdefault(source, [0, 0, -1, 0])
            counts[0] += 1
            if inverted > 0:
                counts[1] += 1
                counts[2] = record.step if counts[2] < 0 else counts[2]
                counts[3] += inverted > 1
        padded = record.scored_padding
        if padded is not None:
            if self.scored_padding is None:
                self.scored_padding_step = record.step
            self.scored_padding = max(padded, self.scored_padding or 0.0)

    def note_affine(self, layers: int | None) -> None:
        """One walk of a forward pass's graph: the model is one affine map of ``layers`` layers, or not (None, which
        settles it for the run)."""
        if layers is None or self._not_affine:
            self._not_affine, self.affine_layers = True, None
        else:
            self.affine_layers = layers if self.affine_layers is None else min(layers, self.affine_layers)

    def note_switch(self, name: str, value: bool, trainable: tuple[str, ...], total: int, step: int) -> None:
        """A fully observed pass found ``name`` given a ``requires_grad`` attribute (see capture/switches.py)."""
        first = self.switches[name][3] if name in self.switches else step
        self.switches[name] = (value, trainable, total, first)

    def note_views(self, found: list[tuple[str, tuple[int, ...], tuple[int, ...]]], step: int) -> None:
        """One fully observed pass's views that mix samples (see capture/sample_views.py), each layer's once."""
        self.view_passes += 1
        first: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        for name, given, made in found:
            first.setdefault(name, (given, made))
        for name, (given, made) in first.items():
            before = self.mixed_views.get(name)
            self.mixed_views[name] = (given, made, before[2] + 1, before[3]) if before else (given, made, 1, step)

    def note_layouts(self, targets: tuple[int, ...], layouts: list[tuple[str, int, int, bool]], step: int) -> None:
        """One fully observed pass: the shape of its loss's targets, one per sample (see
        :func:`~neuraldbg.capture.loss_graph.sample_targets`), and its attention calls' layouts (layer, the lengths of
        the axes it read as its sequence and as its batch, batch_first). A layer whose sequence axis is as long as the
        samples scored and whose batch axis is not attended across the batch. Not judged: a batch axis as long as the
        targets' second axis (targets per position, laid out (sequence, batch) or (batch, sequence)), a batch axis of
        one (attention across the batch on purpose: BatchFormer's)."""
        samples = targets[0]
        per_position = targets[1] if len(targets) == 2 else -1
        judged: set[str] = set()
        for name, sequence, batch, batch_first in layouts:
            if name in judged or batch == per_position or batch < 2:
                continue
            judged.add(name)
            counts = self.batch_attention.setdefault(name, [0, 0, -1, 0, 0, 0])
            counts[0] += 1
            if sequence == samples and batch != samples:
                counts[1] += 1
                if counts[2] < 0:
                    counts[2:] = [step, samples, batch, int(batch_first)]

    def _symmetric(self, step: int, found: dict[str, tuple[int, float]]) -> None:
        """A check of the layers that started with identical units: those that parted are gone for good."""
        kept = {}
        for layer, (units, spread) in found.items():
            _, first, _, seen, _ = self.symmetric.get(layer, (units, step, step, 0, spread))
            kept[layer] = (units, first, step, seen + 1, spread)
        self.symmetric = kept

    def _zero_reading(self, step: int, zero: bool, loss: float | None = None) -> None:
        self.gradient_readings += 1
        if zero:
            self.zero_gradient_readings += 1
            self.early_zero_readings += self.gradient_readings <= EARLY_READINGS
            self.zero_steps = (self.zero_steps or (step, step))[0], step
            return
        self.nonzero_after_zero += self.zero_steps is not None
        self.last_nonzero_step = step
        if loss is not None and math.isfinite(loss):
            if len(self.given_first) < EARLY_READINGS:
                self.given_first.append(loss)
            recent = self.given_recent
            self.given_recent = loss if math.isnan(recent) else recent + GIVEN_PACE * (loss - recent)

    def failed(self, step: int, what: str) -> None:
        self.failures.append((step, what))

    def skip(self, step: int, names: Iterable[str], why: str) -> None:
        for name in names:
            if name not in self.skipped:
                self.skipped[name] = why
                if self.first_skip < 0:
                    self.first_skip = step


@dataclass(frozen=True)
class RunFacts:
    """What the recorder counted that the run-level findings need besides :class:`Coverage`."""

    trainable: int  # trainable parameters of the model
    backward_passes: int
    optimizer_steps: int
    config: DebugConfig = field(default_factory=DebugConfig)  # the thresholds of the run
    history: History | None = None  # the analysed steps' readings (the analyzer's, when it asks a kind)
    largest_gradient: Series | None = None  # ... and the largest layer gradient of each fully observed step


def trained_elsewhere(coverage: Coverage, facts: RunFacts) -> bool:
    """Whether the model was trained through parameters that are not its own: the gradient of the loss reached
    its output (its backward passes were seen), yet on every fully observed step none of its trainable
    parameters held a gradient and no optimizer holding them ever stepped (``torch.func.functional_call`` with
    a dictionary of copies, which an optimizer of its own updates). A loss detached from the output never
    reaches it; gradients cleared between ``backward()`` and an optimizer's step leave that optimizer stepping."""
    return bool(
        coverage.full_steps
        and coverage.steps_with_gradient == 0
        and facts.trainable
        and facts.backward_passes
        and not facts.optimizer_steps
    )
