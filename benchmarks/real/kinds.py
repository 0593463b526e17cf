"""The failure kinds that name each kind of fault, by hand from the fault's nature (never from NeuralDBG's output).

The ground truth adds to these the kinds whose symptom plain torch measured in the faulty run (see
:func:`benchmarks.real.truth.evidence_kinds`).
"""

from __future__ import annotations

LR_FAR_TOO_HIGH = frozenset({"oversized_updates", "unstable_loss", "loss_at_chance", "loss_not_decreasing"})
LR_TOO_HIGH = frozenset({"unstable_loss", "oversized_updates"})
LR_TOO_LOW = frozenset({"loss_not_decreasing", "stalled_updates"})
NO_ZERO_GRAD = frozenset({"gradients_not_zeroed"})
WRONG_LABELS = frozenset({"loss_not_decreasing", "loss_at_chance"})
WRONG_LOSS = frozenset({"loss_not_decreasing", "loss_at_chance"})
RAW_INPUTS = frozenset({"loss_not_decreasing", "unstable_loss", "unnormalised_inputs", "oversized_logits"})
HUGE_DECAY = frozenset({"loss_not_decreasing", "loss_at_chance", "stalled_updates", "excessive_weight_decay"})
TINY_CLIPPING = frozenset({"loss_not_decreasing", "stalled_updates"})
EMPTY_MASK_NAN = frozenset({"degenerate_loss", "no_gradient", "non_finite"})  # a mean over nothing: NaN
EMPTY_MASK_ZERO = frozenset({"degenerate_loss", "no_gradient"})  # a masked mean over an all-zero mask: exactly 0
RELU_ON_LOGITS = frozenset({"dead_neurons", "loss_not_decreasing", "activation_before_loss"})
SOFTMAX_BEFORE_CE = WRONG_LOSS | {"activation_before_loss"}  # the loss applies log_softmax itself
NLL_ON_LOGITS = WRONG_LOSS | {"missing_log_softmax"}  # the fault's own name
BCE_ON_SCORES = WRONG_LOSS | {"missing_sigmoid"}  # raw scores clamped into [0, 1] for BCELoss: the fault's own name
MSE_ON_CLASS_INDEX = WRONG_LOSS | {"class_index_regression"}  # the fault's own name
SHIFTED_TWICE = WRONG_LABELS | {"labels_shifted_twice"}  # the fault's own name
KL_DOMINATES = WRONG_LOSS | {"collapsed_output"}  # a VAE's KL term outweighs its reconstruction: posterior collapse
LEFT_OUT = frozenset({"frozen_parameters"})
# a graph cut: the layers before it get no gradient (as good as left out of the optimizer), named exactly
DETACHED = frozenset({"detached_layers", "frozen_parameters", "loss_not_decreasing"})
DEAD_BIAS = frozenset({"dead_neurons"})
EVAL_MODE = frozenset({"eval_mode_training"})
HEAVY_DROPOUT = frozenset({"excessive_dropout", "loss_not_decreasing", "loss_at_chance"})
# a constant initialisation: every unit of a layer the same (named exactly), or what that leaves in the loss
SYMMETRIC = frozenset({"symmetric_units", "loss_not_decreasing", "loss_at_chance"})
# prediction (N, 1) against target (N,): every prediction compared with every target (named exactly)
BROADCAST = WRONG_LOSS | {"broadcast_loss"}
BIG_INIT = frozenset(
    {"exploding_gradients", "saturated_activations", "unstable_loss", "loss_not_decreasing", "oversized_logits"}
)
SATURATING = frozenset({"saturated_activations", "vanishing_gradients", "loss_not_decreasing"})
UNSHUFFLED = frozenset({"unshuffled_data", "unstable_loss", "loss_not_decreasing"})  # batches sorted by class
CAPACITY = frozenset({"loss_not_decreasing"})  # a change that only makes the model or its training weaker
# the activations removed: the model is one affine map (named exactly)
LINEAR_MODEL = CAPACITY | {"no_nonlinearity"}
# attention over padding tokens: a weaker model, and the fault named exactly
UNMASKED_PADDING = CAPACITY | {"unmasked_padding"}
# an output activation whose range does not hold what the output must match (its targets, or the data a generator
# imitates): saturation against the bound, the loss held up, and the fault named exactly
OUT_OF_RANGE = frozenset({"unreachable_targets", "saturated_activations", "loss_not_decreasing"})
