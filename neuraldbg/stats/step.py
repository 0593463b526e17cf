"""One observed step's statistics as host floats: what the detectors read.

Collected as device tensors by :class:`~neuraldbg.capture.pending.Pending` and filed here at the flush. Nothing
here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SlotKey = tuple[str, int]  # (qualified layer name, call index within one forward pass)


@dataclass(slots=True)
class StepData:
    """Host-side statistics of one observed step. Dictionaries are empty for what was not measured."""

    step: int
    full: bool
    act: dict[SlotKey, float] = field(default_factory=dict)  # L2 norm of each layer's output
    numel: dict[SlotKey, int] = field(default_factory=dict)
    input_norm: float | None = None
    input_numel: int = 0
    # the largest root-mean-square among the call's floating data arguments (the first one and those after it:
    # raw numeric columns after categorical ids), each finite and holding a positive value (an additive mask holds
    # none); None: not read (the call had no floating argument besides its data)
    input_scale: float | None = None
    # the largest root-mean-square of the data where it enters the layers with parameters (the input of the first
    # layer calls with parameters given a floating input, and of those given one without a gradient), after what the
    # model's forward did to its input (``x / 255``, a Normalize with registered buffers); None: not read
    entry_scale: float | None = None
    forwards: int = 0  # forward passes of the model in training mode in this step (an RL episode: its length)
    output_norm: float | None = None
    output_numel: int = 0
    target_grad: float | None = None  # norm of d(loss)/d(model output): falls as the fit improves
    target_grad_sum: float | None = None  # sum of |d(loss)/d(model output)|: the loss's pull in the output's units
    head_grad: float | None = None  # gradient norm of the last parametric layer (fully observed steps)
    head_finite: bool | None = None  # its gradient's first element is finite: on cheap steps, the loss was
    grad_clip_factor: float | None = None  # total gradient norm after backward / at the optimizer step, when > 1
    loss: float | None = None
    warm_start: bool = False  # an optimizer held state at this, the first observed step: the run was met mid-training
    dead: dict[SlotKey, tuple[float, int]] = field(default_factory=dict)  # (dead units, units)
    func_dead: dict[SlotKey, tuple[float, int]] = field(default_factory=dict)  # never positive, zero grad
    output_dead_pulled: tuple[float, int] | None = None  # model output units never positive that the loss pulls on
    saturated: dict[SlotKey, tuple[float, int]] = field(default_factory=dict)  # (saturated, elements)
    out_grad: dict[SlotKey, float] = field(default_factory=dict)  # norm of d(loss)/d(layer output)
    grad: dict[str, float] = field(default_factory=dict)  # parameter -> gradient norm
    grad_numel: dict[str, int] = field(default_factory=dict)
    grad_exact_zero: set[str] = field(default_factory=set)
    grad_nonfinite: set[str] = field(default_factory=set)  # has inf/NaN elements (not a norm overflow)
    # parameter -> gradient norm as the backward pass left it, for those that clipping then made smaller
    grad_before_clip: dict[str, float] = field(default_factory=dict)
    update: dict[str, tuple[float, float]] = field(default_factory=dict)  # parameter -> (||dW||, ||W||)
    update_before: dict[str, float] = field(default_factory=dict)  # parameter -> ||W|| before the step
    update_parts: dict[str, list[float]] = field(default_factory=dict, repr=False)  # readings being assembled
    stepped: dict[str, float] = field(default_factory=dict)  # parameter -> lr of the group that stepped it
    # fully observed steps: the owned optimizers' settings besides the learning rate that size the steps
    # (capture/backward.py): "eps", an adaptive optimizer's largest; "momentum", the largest undampened one
    settings: dict[str, float] = field(default_factory=dict)
    lr_changed: bool = False
    # the parameters of the owned optimizers' groups that decay their weights (weight_decay > 0), when other groups
    # do not (biases and normalisation gains left out of the decay, as the Trainer does); None: all or none decay
    decayed: frozenset[str] | None = None
    skipped: bool = False  # a GradScaler skipped this step's optimizer step (its scaled gradients overflowed)
    loss_scale: float | None = None  # the GradScaler's scale in this step's backward pass
    resumed: bool = False  # an optimizer met at this step already held state: the run trained before it was watched
    loss_observed: bool = False  # the loss was given to observe_loss (else recorded from the backward pass)
    head_zero: bool | None = None  # cheap CPU steps: the head layer's gradient is exactly zero everywhere
    carried: tuple[str, ...] = ()  # parameters whose .grad still held the applied gradient when backward began
    carried_by: str = ""  # the optimizer that applied it ("" without an optimizer)
    # layers whose weight rows (output units) started identical and have not parted although the weights moved
    # (capture/symmetry.py): layer -> (units, spread ||W - mean row|| / ||W||); None: not checked on this step (a
    # cheap step, or no layer started with identical units)
    symmetric: dict[str, tuple[int, float]] | None = None
    grad_carried: float | None = None  # > 0: that carried gradient was not all zeros (the carry-over is proved)
    # fully observed steps whose gradients something changed in place between the backward pass and the optimizer
    # step: the largest gradient norm the backward pass left (grad_left), and the largest magnitude of a few of
    # those gradients at the step (grad_kept; 0: zeroed)
    grad_left: float | None = None
    grad_kept: float | None = None
    optimizers: set[int] = field(default_factory=set)  # ids of the owned optimizers that stepped
    classes: int = 0  # fully observed steps: the last dimension of the model's (logit) output, 0 if none
    probabilities: bool | None = None  # ... of one unit: every output in [0, 1] (a sigmoid's probabilities)
    # the target of a mean squared error on one value per sample (capture/loss_graph.py), as read at the flush:
    # [all integers (1.0/0.0), smallest, largest, variance]
    regression_target: list[float] = field(default_factory=list)
    # the targets of a loss by value on a bounded output: [share out of its range, least MSE it allows, variance]
    target_range: list[float] = field(default_factory=list)
    # data given to the model without a graph, on steps where other inputs came from a bounded activation (a
    # generator's sigmoid or tanh): one [share out of its range, least MSE it allows, variance] per pass
    input_range: list[list[float]] = field(default_factory=list)
    # the input of an nll_loss that no log_softmax produced: its largest |logsumexp| over the classes (0: log-probs)
    log_prob_gap: float | None = None
    # the input of a clamp that made a binary_cross_entropy's input: its share of values outside [0, 1] (0 for
    # probabilities clamped away from 0 and 1; raw scores, a sigmoid forgotten, have many)
    clamped_outside: float | None = None
    # the labels of an nll_loss counted over the first backward passes: [entropy of their frequencies (nats), labels
    # counted, labels outside the classes], and the number of classes (dimension 1 of the loss's input)
    label_prior: list[float] = field(default_factory=list)
    label_classes: int = 0
    # ... and how mixed a fully observed step's labels were (capture/label_mix.py), filed at a later step: [the
    # step, its most frequent class, that class's share, 1 when it held enough labels to count], one per step
    label_steps: list[list[float]] = field(default_factory=list)
    # ... and how many classes each of its rows chooses among: its finite entries (a contrastive loss masks each
    # sample's own column), averaged over the rows; None: not read
    loss_options: float | None = None
    # ... and, for a binary cross-entropy on a softmax's output, how many positive labels its targets hold along the
    # softmax's dimension, averaged over its rows; None: not read
    softmax_positives: float | None = None
    # the largest rate of a dropout the forward code applied itself (F.dropout, a mask by hand), read from the loss's
    # graph on the first fully observed backward passes (capture/dropout_graph.py); None: not read
    graph_dropout: float | None = None
    # a binary cross-entropy or a mean squared error that is the loss (its mean): its chance level from the targets
    # of the first backward passes (capture/ledger.py), [per column, pooled, samples per column, values outside
    # [0, 1] or not finite, the targets' root-mean-square], and the loss's kind ("bce", "mse")
    target_baseline: list[float] = field(default_factory=list)
    baseline_kind: str = ""
    # a causal LM that shifts its labels itself: the share of labels that already are the next input token
    labels_ahead: float | None = None
    # a model whose attention ran with no mask over its tokens: the share of its loss's targets that are the next
    # token of its own input (capture/loss_graph.py next_token_nll); None: not read
    next_token: float | None = None
    # ... and the share of the labels it scores that sit where its attention mask hides the input (padding)
    scored_padding: float | None = None
    # padding masks read against the model's token input: whether each hid the real tokens and showed the padding
    # (1.0), by source ("": the model's attention_mask argument; else the attention layer given key_padding_mask)
    inverted_masks: dict[str, float] = field(default_factory=dict)
    loss_terms: int = 1  # the backward passes whose losses make up ``loss`` (several: accumulated, summed)
    samples: list[float] = field(default_factory=list)  # a fingerprint of each sample of the input batch
    sample_count: int = 0  # ... how many (known when the forward pass files them, before the flush)
    sample_losses: list[float] = field(default_factory=list)  # each sample's own loss, in the same order
    sample_hits: list[float] = field(default_factory=list)  # ... whether it was predicted right (see stats.samples)
    padded: bool | None = None  # ... the model's token input holds the id the loss ignores (None: not read)
