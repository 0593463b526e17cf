"""The vocabulary of the engine: failure kinds, event types, and the semantic event itself.

A :class:`SemanticEvent` is a state that held for a range of observed steps in one layer ("``'3'`` had 100 % of
its units inactive from step 0 to 49"). Events are what the detectors emit and what the reasoning consumes.

A :class:`FailureKind` is only a name. Everything else about a kind (the detectors that find it, where it stands
among root causes, the causal rules in which it is the cause, its words) lives in its room under
:mod:`neuraldbg.kinds`, which the rest of the engine asks through the registry. Plugins add kinds of their own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar

from .health import HealthState

#: What a kind's name may be: a Python identifier in lower case, at most 64 characters.
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


class _Names(type):
    """Iterating over :class:`FailureKind` lists every declared kind, built-in kinds first, in declaration order."""

    def __iter__(cls) -> Iterator[FailureKind]:
        return iter(list(FailureKind._declared.values()))

    def __len__(cls) -> int:
        return len(FailureKind._declared)

    def __contains__(cls, value: object) -> bool:
        return isinstance(value, str) and value in FailureKind._declared


class FailureKind(str, metaclass=_Names):
    """The stable name of a kind of training failure, as it appears in events, traces and reports.

    The built-in kinds are class attributes (``FailureKind.DEAD_NEURONS``); a plugin declares its own with
    :meth:`declare` (done for it when it registers a :class:`~neuraldbg.kinds.Kind`). Names are interned:
    ``FailureKind("dead_neurons") is FailureKind.DEAD_NEURONS``, so kinds compare with ``is``; a kind is also
    the plain string of its name (``==``, JSON). ``FailureKind("unknown")`` raises ``ValueError``, as an enum
    would; :meth:`declare` creates a kind that does not exist yet (a trace from a plugin that is not installed).
    """

    _declared: ClassVar[dict[str, FailureKind]] = {}

    # the built-in kinds: the names users and traces know (everything else about each is in neuraldbg/kinds/)
    VANISHING_GRADIENTS: ClassVar[FailureKind]
    EXPLODING_GRADIENTS: ClassVar[FailureKind]
    DEAD_NEURONS: ClassVar[FailureKind]
    SATURATED_ACTIVATIONS: ClassVar[FailureKind]
    NON_FINITE: ClassVar[FailureKind]
    FROZEN_PARAMETERS: ClassVar[FailureKind]
    STALLED_UPDATES: ClassVar[FailureKind]
    NO_TRAINING_OBSERVED: ClassVar[FailureKind]
    NO_GRADIENT: ClassVar[FailureKind]
    EVAL_MODE_TRAINING: ClassVar[FailureKind]
    DEGENERATE_LOSS: ClassVar[FailureKind]
    INCOMPLETE_OBSERVATION: ClassVar[FailureKind]
    LOSS_SCALE_COLLAPSE: ClassVar[FailureKind]
    OVERSIZED_UPDATES: ClassVar[FailureKind]
    GRADIENTS_NOT_ZEROED: ClassVar[FailureKind]
    DISCARDED_GRADIENTS: ClassVar[FailureKind]
    OPTIMIZER_RESET: ClassVar[FailureKind]
    MISSING_CAUSAL_MASK: ClassVar[FailureKind]
    MODULE_REQUIRES_GRAD: ClassVar[FailureKind]
    VIEW_ACROSS_BATCH: ClassVar[FailureKind]
    LOSS_NOT_DECREASING: ClassVar[FailureKind]
    UNSTABLE_LOSS: ClassVar[FailureKind]
    LOSS_AT_CHANCE: ClassVar[FailureKind]
    ACTIVATION_BEFORE_LOSS: ClassVar[FailureKind]
    UNNORMALISED_INPUTS: ClassVar[FailureKind]
    MISSING_LOG_SOFTMAX: ClassVar[FailureKind]
    MISSING_SIGMOID: ClassVar[FailureKind]
    DETACHED_LAYERS: ClassVar[FailureKind]
    UNREACHABLE_TARGETS: ClassVar[FailureKind]
    CLASS_INDEX_REGRESSION: ClassVar[FailureKind]
    COLLAPSED_OUTPUT: ClassVar[FailureKind]
    LABELS_SHIFTED_TWICE: ClassVar[FailureKind]
    LABELS_ON_PADDING: ClassVar[FailureKind]
    INVERTED_PADDING_MASK: ClassVar[FailureKind]
    OVERSIZED_LOGITS: ClassVar[FailureKind]
    UNMASKED_PADDING: ClassVar[FailureKind]
    EXCESSIVE_WEIGHT_DECAY: ClassVar[FailureKind]
    EXCESSIVE_DROPOUT: ClassVar[FailureKind]
    SYMMETRIC_UNITS: ClassVar[FailureKind]
    BROADCAST_LOSS: ClassVar[FailureKind]
    NO_NONLINEARITY: ClassVar[FailureKind]
    UNSHUFFLED_DATA: ClassVar[FailureKind]
    ADVANTAGE_NOT_DETACHED: ClassVar[FailureKind]
    ATTENTION_ACROSS_BATCH: ClassVar[FailureKind]

    def __new__(cls, value: str) -> FailureKind:
        found = cls._declared.get(value) if isinstance(value, str) else None
        if found is None:
            raise ValueError(f"{value!r} is not a declared FailureKind")
        return found

    @classmethod
    def declare(cls, name: str) -> FailureKind:
        """The kind called ``name``, declared now if it is new. ``name``: lower case letters, digits and ``_``,
        starting with a letter, at most 64 characters (``ValueError`` otherwise)."""
        found = cls._declared.get(name)
        if found is not None:
            return found
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(
                f"a failure kind's name must be lower-case letters, digits and '_', starting with a letter, at most "
                f"64 characters; got {name!r}"
            )
        kind = str.__new__(cls, name)
        cls._declared[name] = kind
        return kind

    @property
    def value(self) -> str:
        """The name as a plain string (``"dead_neurons"``)."""
        return str.__str__(self)

    @property
    def name(self) -> str:
        """The attribute name of a built-in kind (``"DEAD_NEURONS"``)."""
        return self.value.upper()

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"<FailureKind.{self.name}>"

    def __reduce__(self) -> tuple[type[FailureKind], tuple[str]]:
        return FailureKind.declare, (self.value,)  # type: ignore[return-value]

    def __copy__(self) -> FailureKind:
        return self

    def __deepcopy__(self, memo: object) -> FailureKind:
        return self


for _name in (
    "vanishing_gradients",
    "exploding_gradients",
    "dead_neurons",
    "saturated_activations",
    "non_finite",
    "frozen_parameters",
    "stalled_updates",
    "no_training_observed",
    "no_gradient",
    "eval_mode_training",
    "degenerate_loss",
    "incomplete_observation",
    "loss_scale_collapse",
    "oversized_updates",
    "gradients_not_zeroed",
    "discarded_gradients",
    "optimizer_reset",
    "loss_not_decreasing",
    "unstable_loss",
    "loss_at_chance",
    "activation_before_loss",
    "unnormalised_inputs",
    "class_index_regression",
    "collapsed_output",
    "labels_shifted_twice",
    "labels_on_padding",
    "inverted_padding_mask",
    "missing_causal_mask",
    "module_requires_grad",
    "view_across_batch",
    "oversized_logits",
    "unmasked_padding",
    "missing_log_softmax",
    "missing_sigmoid",
    "detached_layers",
    "excessive_weight_decay",
    "unreachable_targets",
    "excessive_dropout",
    "symmetric_units",
    "broadcast_loss",
    "no_nonlinearity",
    "unshuffled_data",
    "advantage_not_detached",
    "attention_across_batch",
):
    setattr(FailureKind, _name.upper(), FailureKind.declare(_name))


class EventType(str, Enum):
    """Which signal an event was observed on."""

    GRADIENT = "gradient"  # parameter gradients of a layer (to_state: a GradientHealth value)
    ACTIVATION = "activation"  # a layer's output in the forward pass (to_state: an ActivationHealth value)
    UPDATE = "update"  # what the optimizer did to a layer's parameters (to_state: an UpdateHealth value)
    INPUT = "input"  # the batch fed to the model (layer "")
    LOSS = "loss"  # the loss, when observed with ``observe_loss`` (layer "")
    RUN = "run"  # the run as a whole: what was observed of it (layer ""; kind: a run-level kind)

    def __str__(self) -> str:
        return self.value


#: How a finding about the model as a whole (layer ``""``) names its place, by the signal it was seen on.
_MODEL_PLACES = {
    EventType.INPUT: "the input batch",
    EventType.LOSS: "the loss",
    EventType.UPDATE: "the model's updates",
    EventType.RUN: "the run",
}


def place(layer: str, param: str | None, event_type: EventType) -> str:
    """Where something held, in words: the quoted parameter or layer name; for the model as a whole (layer
    ``""``) what was observed there: "the input batch", "the loss", "the model's updates", "the run" or "the
    model". The one definition events, reports and a job's findings share."""
    if param is not None:
        return f"'{param}'"
    if layer:
        return f"'{layer}'"
    return _MODEL_PLACES.get(event_type, "the model")


@dataclass(frozen=True)
class SemanticEvent:
    """A health state that held in one layer over a range of observed steps.

    ``layer`` is the module's qualified name exactly as in ``model.named_modules()`` (``""`` is the model as a
    whole: its input, its loss, or a global property such as the learning rate). ``param`` is the qualified
    parameter name (``model.named_parameters()``) when the event concerns one parameter. ``to_state`` is a member
    of a :class:`~neuraldbg.health.HealthState` enum (for a run-level finding, its kind; read from a trace of a
    plugin that is not installed, the plain name). ``from_state`` is ``None`` when the state was present from the
    layer's first observed step. ``metrics`` carries the numbers that show the state (all floats); ``confidence``
    is in [0, 1]; ``detail`` holds words the numbers cannot carry (e.g. which hook of the debugger failed, and
    with what), empty for most events. ``kind`` is None for evidence that only explains other failures (outputs
    blowing up, updates as large as the weights).
    """

    event_type: EventType
    kind: FailureKind | None
    layer: str
    param: str | None
    step_start: int
    step_end: int
    from_state: HealthState | str | None
    to_state: HealthState | str
    metrics: dict[str, float] = field(default_factory=dict)
    confidence: float = 1.0
    detail: str = ""  # words the numbers cannot carry (run-level events: what stopped the observation)

    @property
    def steps(self) -> int:
        """Number of steps the event spans (inclusive)."""
        return self.step_end - self.step_start + 1

    @property
    def where(self) -> str:
        """Where it held, in words (see :func:`place`)."""
        return place(self.layer, self.param, self.event_type)

    def __str__(self) -> str:
        """In plain words, as its kind's room writes it: ``'3': 100% of 64 units dead (never positive), steps
        0-49``."""
        return _describe(self)


def _plain(e: SemanticEvent) -> str:
    span = f"step {e.step_start}" if e.step_start == e.step_end else f"steps {e.step_start}-{e.step_end}"
    return f"{e.where}: {str(e.to_state).replace('_', ' ')}, {span}"


#: How ``str(event)`` words an event. The kinds registry (:mod:`neuraldbg.kinds`), which knows every kind's words,
#: installs its writer when it is imported; this module sits below it and cannot import it.
_describe: Callable[[SemanticEvent], str] = _plain


def describe_events_with(writer: Callable[[SemanticEvent], str]) -> None:
    """Make ``str(event)`` use ``writer`` (called once, by the kinds registry)."""
    global _describe
    _describe = writer
