"""Health states of a layer, one enum per signal.

Each state maps to the failure kind it is evidence of (``None`` for the normal states and for evidence that is
only used to explain other failures, such as anomalous activation magnitudes).
"""

from __future__ import annotations

from enum import Enum

from .events import FailureKind


class GradientHealth(str, Enum):
    """State of a layer's parameter gradients at one step."""

    HEALTHY = "healthy"
    VANISHING = "vanishing"
    EXPLODING = "exploding"
    NON_FINITE = "non_finite"

    @property
    def kind(self) -> FailureKind | None:
        return _GRADIENT_KINDS[self]


class ActivationHealth(str, Enum):
    """State of a layer's output at one step."""

    NORMAL = "normal"
    SATURATED = "saturated"  # bounded activation (tanh, sigmoid, ...) pinned at its bounds
    DEAD = "dead"  # ReLU-family units that are active on (almost) no sample
    ANOMALOUS = "anomalous"  # magnitude far outside the normal range
    NON_FINITE = "non_finite"

    @property
    def kind(self) -> FailureKind | None:
        return _ACTIVATION_KINDS[self]


class UpdateHealth(str, Enum):
    """What the optimizer did to a layer's parameters at one step."""

    NORMAL = "normal"
    FROZEN = "frozen"  # the parameter gets a gradient but never changes
    STALLED = "stalled"  # updates are vanishingly small against the weights
    EXPLODING = "exploding"  # updates as large as the weights themselves: the learning rate is far too high

    @property
    def kind(self) -> FailureKind | None:
        return _UPDATE_KINDS[self]


_GRADIENT_KINDS = {
    GradientHealth.HEALTHY: None,
    GradientHealth.VANISHING: FailureKind.VANISHING_GRADIENTS,
    GradientHealth.EXPLODING: FailureKind.EXPLODING_GRADIENTS,
    GradientHealth.NON_FINITE: FailureKind.NON_FINITE,
}
_ACTIVATION_KINDS = {
    ActivationHealth.NORMAL: None,
    ActivationHealth.SATURATED: FailureKind.SATURATED_ACTIVATIONS,
    ActivationHealth.DEAD: FailureKind.DEAD_NEURONS,
    ActivationHealth.ANOMALOUS: None,
    ActivationHealth.NON_FINITE: FailureKind.NON_FINITE,
}
_UPDATE_KINDS = {
    UpdateHealth.NORMAL: None,
    UpdateHealth.FROZEN: FailureKind.FROZEN_PARAMETERS,
    UpdateHealth.STALLED: FailureKind.STALLED_UPDATES,
    UpdateHealth.EXPLODING: None,  # evidence: the cause of the dead units, explosions or NaN that follow
}
