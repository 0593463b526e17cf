"""Health states of a layer, one enum per signal, all under :class:`HealthState`.

A state says what held at one step ("dead", "vanishing"); which failure kind it is evidence of is its kind's room's
business (:mod:`neuraldbg.kinds`): the engine never compares states as strings. A plugin that adds a kind with
states of its own subclasses :class:`HealthState`.
"""

from __future__ import annotations

from enum import Enum


class HealthState(str, Enum):
    """Base of every health-state enum (each member is also the plain string of its value, for traces)."""

    def __str__(self) -> str:
        return str(self.value)


class GradientHealth(HealthState):
    """State of a layer's parameter gradients at one step."""

    HEALTHY = "healthy"
    VANISHING = "vanishing"
    EXPLODING = "exploding"
    NON_FINITE = "non_finite"


class ActivationHealth(HealthState):
    """State of a layer's output (or of the input batch, or the loss) at one step."""

    NORMAL = "normal"
    SATURATED = "saturated"  # bounded activation (tanh, sigmoid, ...) pinned at its bounds
    DEAD = "dead"  # ReLU-family units that are active on (almost) no sample
    ANOMALOUS = "anomalous"  # magnitude far outside the normal range
    AMPLIFYING = "amplifying"  # a parametric layer whose output is many times larger than its input
    NON_FINITE = "non_finite"


class UpdateHealth(HealthState):
    """What the optimizer did to a layer's parameters at one step."""

    NORMAL = "normal"
    FROZEN = "frozen"  # the parameter gets a gradient but never changes
    STALLED = "stalled"  # updates are vanishingly small against the weights
    EXPLODING = "exploding"  # updates as large as the weights themselves: the learning rate is far too high


#: Which enum the states of each signal belong to (the input batch and the loss are read like a layer's output).
STATES_OF: dict[str, type[HealthState]] = {
    "gradient": GradientHealth,
    "activation": ActivationHealth,
    "input": ActivationHealth,
    "loss": ActivationHealth,
    "update": UpdateHealth,
}


def normal_state(event_type: str) -> HealthState:
    """The state of a signal when nothing is wrong with it."""
    if event_type == "gradient":
        return GradientHealth.HEALTHY
    return UpdateHealth.NORMAL if event_type == "update" else ActivationHealth.NORMAL


def state_of(event_type: str, value: str) -> HealthState | str:
    """The enum member named ``value`` for a signal (``"dead"`` on an activation), or ``value`` itself when no
    built-in state has that name (a plugin's state read back from a trace)."""
    enum = STATES_OF.get(event_type)
    if enum is not None:
        for member in enum:
            if member.value == value:
                return member
    return value


def is_state(value: HealthState | str | None, state: HealthState) -> bool:
    """Whether ``value`` is ``state``: the same member (``GradientHealth.EXPLODING`` and ``UpdateHealth.EXPLODING``
    share a name, not a meaning), or a plain string of its name (an event built by hand)."""
    return value is state or (not isinstance(value, HealthState) and value == state.value)
