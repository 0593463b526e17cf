"""One room per failure kind, and the list of them.

Each module here holds everything about one built-in kind: its detectors and the config fields they read, the
health states that are it, where it stands among root causes, the causal rules in which it is the cause, its words
(explanation and fix, event text, graph label, effect words) and what the pytest plugin needs. Adding a kind is one
file and one line below; a plugin adds one through :func:`neuraldbg.plugins.hookspecs.neuraldbg_kinds`.

Everything else asks a kind through :mod:`.registry` (``room(kind)``, ``room_of(event)``): the reasoning, the
explanations, Mermaid, traces, the distributed merge and the plugin never name another kind's members.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..config import DebugConfig
from ..detectors.base import Detector
from ..events import describe_events_with
from ..reasoning.rules import LOSS_RELATION, SETS_OFF, CausalRule, ShowsInTheLoss, SurgeSetsOff
from . import (
    activation_before_loss,
    advantage_not_detached,
    attention_across_batch,
    broadcast_loss,
    class_index_regression,
    collapsed_output,
    dead_neurons,
    degenerate_loss,
    detached_layers,
    discarded_gradients,
    eval_mode_training,
    excessive_dropout,
    excessive_weight_decay,
    exploding_gradients,
    frozen_parameters,
    gradients_not_zeroed,
    incomplete_observation,
    inverted_padding_mask,
    labels_on_padding,
    labels_shifted_twice,
    loss_at_chance,
    loss_not_decreasing,
    loss_scale_collapse,
    missing_causal_mask,
    missing_log_softmax,
    missing_sigmoid,
    module_requires_grad,
    no_gradient,
    no_nonlinearity,
    no_training_observed,
    non_finite,
    optimizer_reset,
    oversized_logits,
    oversized_updates,
    registry,
    saturated_activations,
    stalled_updates,
    symmetric_units,
    unmasked_padding,
    unnormalised_inputs,
    unreachable_targets,
    unshuffled_data,
    unstable_loss,
    vanishing_gradients,
    view_across_batch,
)
from .base import Check, Kind, RootLane, RootPool, Series, Unregistered
from .registry import register, resolve, room, room_of, rooms

#: The built-in kinds. Layer kinds in the order the health JUnit file lists them; run-level kinds in the order
#: their findings are made.
BUILTIN: tuple[Kind, ...] = (
    vanishing_gradients.VanishingGradients(),
    exploding_gradients.ExplodingGradients(),
    dead_neurons.DeadNeurons(),
    saturated_activations.SaturatedActivations(),
    non_finite.NonFinite(),
    frozen_parameters.FrozenParameters(),
    stalled_updates.StalledUpdates(),
    oversized_updates.OversizedUpdates(),
    no_training_observed.NoTrainingObserved(),
    no_gradient.NoGradient(),
    degenerate_loss.DegenerateLoss(),
    eval_mode_training.EvalModeTraining(),
    gradients_not_zeroed.GradientsNotZeroed(),
    discarded_gradients.DiscardedGradients(),
    optimizer_reset.OptimizerReset(),
    activation_before_loss.ActivationBeforeLoss(),
    missing_log_softmax.MissingLogSoftmax(),
    missing_sigmoid.MissingSigmoid(),
    detached_layers.DetachedLayers(),
    unreachable_targets.UnreachableTargets(),
    unnormalised_inputs.UnnormalisedInputs(),
    class_index_regression.ClassIndexRegression(),
    collapsed_output.CollapsedOutput(),
    labels_shifted_twice.LabelsShiftedTwice(),
    labels_on_padding.LabelsOnPadding(),
    inverted_padding_mask.InvertedPaddingMask(),
    missing_causal_mask.MissingCausalMask(),
    module_requires_grad.ModuleRequiresGrad(),
    view_across_batch.ViewAcrossBatch(),
    oversized_logits.OversizedLogits(),
    unmasked_padding.UnmaskedPadding(),
    loss_scale_collapse.LossScaleCollapse(),
    excessive_weight_decay.ExcessiveWeightDecay(),
    excessive_dropout.ExcessiveDropout(),
    symmetric_units.SymmetricUnits(),
    broadcast_loss.BroadcastLoss(),
    no_nonlinearity.NoNonlinearity(),
    unshuffled_data.UnshuffledData(),
    advantage_not_detached.AdvantageNotDetached(),
    attention_across_batch.AttentionAcrossBatch(),
    loss_at_chance.LossAtChance(),
    unstable_loss.UnstableLoss(),
    loss_not_decreasing.LossNotDecreasing(),
    incomplete_observation.IncompleteObservation(),
)
for _room in BUILTIN:
    register(_room)
describe_events_with(registry.event_text)


def detectors(config: DebugConfig, kinds: Iterable[Kind] | None = None) -> list[Detector]:
    """Fresh detectors of ``kinds`` (default: every registered kind), the non-finite checks first."""
    chosen = list(rooms() if kinds is None else kinds)
    found = [d for k in chosen for d in k.detectors(config)]
    return sorted(found, key=lambda d: not d.every_step)  # stable: rooms' order otherwise


#: The last :func:`rules` asked for, by the kinds it was asked for and the registry's generation it was resolved in:
#: every debugger asks for the same (rules are frozen; resolving them anew costs a fifth of a millisecond).
_resolved: tuple[tuple[Kind, ...], int, tuple[CausalRule, ...]] | None = None


def rules(kinds: Iterable[Kind] | None = None) -> list[CausalRule]:
    """The causal rules of ``kinds`` (default: every registered kind), effects named by state resolved to kinds,
    and the learning rate's: updates as large as the weights set off the failures a learning rate can."""
    global _resolved
    chosen = list(rooms() if kinds is None else kinds)
    last = _resolved
    if last is not None and last[1] == registry.generation and registry.same_objects(last[0], chosen):
        return list(last[2])
    found = _rules(chosen)
    _resolved = (tuple(chosen), registry.generation, tuple(found))
    return found


def _rules(chosen: list[Kind]) -> list[CausalRule]:
    found = [resolve(rule) for k in chosen for rule in k.rules()]
    sensitive = tuple(k.kind for k in chosen if k.lr_sensitive)
    # every fault explains the loss findings it came before: they are how it shows in the loss
    symptoms = tuple(k.kind for k in chosen if k.loss_symptom)
    late = tuple(k.kind for k in chosen if k.late_loss_symptom)
    faults = [k.kind for k in chosen if not (k.loss_symptom or k.inconclusive)] if symptoms or late else []
    shows = [
        ShowsInTheLoss(f"{kind}-shows-in-the-loss", LOSS_RELATION, kind, (*symptoms, *late), late=late)
        for kind in faults
    ]
    return [*found, SurgeSetsOff("surge-sets-off", SETS_OFF, None, sensitive, same_place_joins=True), *shows]


__all__ = [
    "BUILTIN",
    "Check",
    "Kind",
    "RootLane",
    "RootPool",
    "Series",
    "Unregistered",
    "detectors",
    "register",
    "room",
    "room_of",
    "rooms",
    "rules",
]
