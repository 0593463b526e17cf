"""The diagnosis benchmark's scenario library: small deterministic training runs with known ground truth.

``SCENARIOS`` lists every scenario (unique names); ``get(name)`` looks one up.
"""

from __future__ import annotations

from . import (
    attention,
    closure,
    dead,
    gradients,
    healthy,
    nonfinite,
    normalization,
    optimizer,
    saturation,
    scale,
    zerograd,
)
from .base import KINDS, Batch, GroundTruth, Run, Scenario, StepProbe

SCENARIOS: list[Scenario] = [
    *healthy.SCENARIOS,
    *dead.SCENARIOS,
    *saturation.SCENARIOS,
    *gradients.SCENARIOS,
    *nonfinite.SCENARIOS,
    *optimizer.SCENARIOS,
    *scale.SCENARIOS,
    *attention.SCENARIOS,
    *normalization.SCENARIOS,
    *closure.SCENARIOS,
    *zerograd.SCENARIOS,
]

_BY_NAME = {s.name: s for s in SCENARIOS}
if len(_BY_NAME) != len(SCENARIOS):  # pragma: no cover - guarded by the test suite too
    raise RuntimeError("duplicate scenario names")


def get(name: str) -> Scenario:
    """The scenario called ``name``; ``KeyError`` lists the known names when there is none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no scenario {name!r}; known: {sorted(_BY_NAME)}") from None


__all__ = ["KINDS", "SCENARIOS", "Batch", "GroundTruth", "Run", "Scenario", "StepProbe", "get"]
