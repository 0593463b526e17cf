"""Detectors: the small contract each one implements, and the per-step view they read (:mod:`.base`).

The detectors themselves live in the rooms of the kinds they find (:mod:`neuraldbg.kinds`); a plugin writes its
own over the same base class.
"""

from __future__ import annotations

from .base import Context, Detector, Finding, Observation, StepView, strength

__all__ = ["Context", "Detector", "Finding", "Observation", "StepView", "strength"]
