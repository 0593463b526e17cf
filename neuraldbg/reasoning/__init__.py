"""Reasoning: from semantic events to ranked causal hypotheses, couplings and explanations."""

from __future__ import annotations

from .engine import diagnose
from .hypothesis import CausalHypothesis, Coupling
from .rules import CausalRule
from .topology import Topology


def builtin_rules() -> list[CausalRule]:
    """The causal rules of every registered kind (see :func:`neuraldbg.kinds.rules`)."""
    from ..kinds import rules

    return rules()


__all__ = ["CausalHypothesis", "CausalRule", "Coupling", "Topology", "builtin_rules", "diagnose"]
