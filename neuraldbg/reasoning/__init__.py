"""Reasoning: from semantic events to ranked causal hypotheses, couplings and explanations."""

from __future__ import annotations

from .engine import diagnose
from .hypothesis import CausalHypothesis, Coupling
from .rules import CausalRule, builtin_rules
from .topology import Topology

__all__ = ["CausalHypothesis", "CausalRule", "Coupling", "Topology", "builtin_rules", "diagnose"]
