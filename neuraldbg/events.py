"""The vocabulary of the engine: failure kinds, event types, and the semantic event itself.

A :class:`SemanticEvent` is a state that held for a range of observed steps in one layer ("``'3'`` had 100 % of
its units inactive from step 0 to 49"). Events are what the detectors emit and what the reasoning consumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class FailureKind(str, Enum):
    """The public, stable names of the training failures NeuralDBG diagnoses."""

    VANISHING_GRADIENTS = "vanishing_gradients"
    EXPLODING_GRADIENTS = "exploding_gradients"
    DEAD_NEURONS = "dead_neurons"
    SATURATED_ACTIVATIONS = "saturated_activations"
    NON_FINITE = "non_finite"
    FROZEN_PARAMETERS = "frozen_parameters"
    STALLED_UPDATES = "stalled_updates"
    # Run-level findings: the run was not observed well enough, or could not learn, whatever its layers did.
    # A verdict of "healthy" needs evidence; these say what evidence is missing (events of type RUN, layer "").
    NO_TRAINING_OBSERVED = "no_training_observed"  # no training step happened under the debugger
    NO_GRADIENT = "no_gradient"  # steps were taken, but no gradient ever reached a trainable parameter
    EVAL_MODE_TRAINING = "eval_mode_training"  # the model trained in eval mode (dropout off, batch norm frozen)
    DEGENERATE_LOSS = "degenerate_loss"  # the loss gives exactly zero gradient: nothing can be learned
    INCOMPLETE_OBSERVATION = "incomplete_observation"  # the debugger stopped observing, or skipped a part
    LOSS_SCALE_COLLAPSE = "loss_scale_collapse"  # a GradScaler skipping most steps (or backed off below 1)

    def __str__(self) -> str:
        return self.value

    @property
    def run_level(self) -> bool:
        """Whether this kind is about the run as a whole (what was observed) rather than a layer's health."""
        return self in RUN_LEVEL_KINDS


class EventType(str, Enum):
    """Which signal an event was observed on."""

    GRADIENT = "gradient"  # parameter gradients of a layer (to_state: a GradientHealth value)
    ACTIVATION = "activation"  # a layer's output in the forward pass (to_state: an ActivationHealth value)
    UPDATE = "update"  # what the optimizer did to a layer's parameters (to_state: an UpdateHealth value)
    INPUT = "input"  # the batch fed to the model (layer "")
    LOSS = "loss"  # the loss, when observed with ``observe_loss`` (layer "")
    RUN = "run"  # the run as a whole: what was observed of it (layer ""; kind: a run-level FailureKind)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SemanticEvent:
    """A health state that held in one layer over a range of observed steps.

    ``layer`` is the module's qualified name exactly as in ``model.named_modules()`` (``""`` is the model as a
    whole: its input, its loss, or a global property such as the learning rate). ``param`` is the qualified
    parameter name (``model.named_parameters()``) when the event concerns one parameter. ``from_state`` is
    ``None`` when the state was present from the layer's first observed step. ``metrics`` carries the numbers
    that show the state (all floats); ``confidence`` is in [0, 1]; ``detail`` holds words the numbers cannot carry
    (e.g. which hook of the debugger failed, and with what), empty for most events.
    """

    event_type: EventType
    kind: FailureKind | None
    layer: str
    param: str | None
    step_start: int
    step_end: int
    from_state: str | None
    to_state: str
    metrics: dict[str, float] = field(default_factory=dict)
    confidence: float = 1.0
    detail: str = ""  # words the numbers cannot carry (run-level events: what stopped the observation)

    @property
    def steps(self) -> int:
        """Number of steps the event spans (inclusive)."""
        return self.step_end - self.step_start + 1

    @property
    def where(self) -> str:
        """Where it held, in words: the quoted parameter or layer name; for the model as a whole (layer ``""``)
        what was observed there: "the input batch", "the loss", "the model's updates", "the run" or "the model"."""
        if self.param is not None:
            return f"'{self.param}'"
        if self.layer:
            return f"'{self.layer}'"
        if self.event_type is EventType.INPUT:
            return "the input batch"
        if self.event_type is EventType.LOSS:
            return "the loss"
        if self.event_type is EventType.UPDATE:
            return "the model's updates"
        if self.event_type is EventType.RUN:
            losses = (FailureKind.DEGENERATE_LOSS, FailureKind.NO_GRADIENT)
            return "the loss" if self.kind in losses else "the run"
        return "the model"

    def step_range(self) -> str:
        """ "step 3" or "steps 0-32"."""
        if self.step_start == self.step_end:
            return f"step {self.step_start}"
        return f"steps {self.step_start}-{self.step_end}"

    def __str__(self) -> str:
        """In plain words: ``'3': 100% of 64 units dead (never positive), steps 0-49``."""
        from .reasoning.words import event_text  # the words live with the explanations that use them

        return event_text(self)


#: The failure kinds about the run as a whole (see :attr:`FailureKind.run_level`).
RUN_LEVEL_KINDS = frozenset(
    {
        FailureKind.NO_TRAINING_OBSERVED,
        FailureKind.NO_GRADIENT,
        FailureKind.EVAL_MODE_TRAINING,
        FailureKind.DEGENERATE_LOSS,
        FailureKind.INCOMPLETE_OBSERVATION,
        FailureKind.LOSS_SCALE_COLLAPSE,
    }
)
