"""Detectors: one failure signal per module, over the tiny base class in :mod:`.base`."""

from __future__ import annotations

from .base import Context, Detector, Finding, Observation, StepView
from .dead import DeadUnitsDetector
from .gain import GainDetector
from .gradients import GradientDetector
from .magnitude import MagnitudeDetector
from .nonfinite import NonFiniteDetector
from .saturation import SaturationDetector
from .updates import UpdateDetector


def builtin_detectors() -> list[Detector]:
    """Fresh instances of every built-in detector."""
    return [
        NonFiniteDetector(),
        GradientDetector(),
        DeadUnitsDetector(),
        SaturationDetector(),
        MagnitudeDetector(),
        GainDetector(),
        UpdateDetector(),
    ]


__all__ = [
    "Context",
    "DeadUnitsDetector",
    "Detector",
    "Finding",
    "GainDetector",
    "GradientDetector",
    "MagnitudeDetector",
    "NonFiniteDetector",
    "Observation",
    "SaturationDetector",
    "StepView",
    "UpdateDetector",
    "builtin_detectors",
]
