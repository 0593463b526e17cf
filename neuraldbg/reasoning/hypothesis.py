"""What the reasoning produces: ranked causal hypotheses and the causal links between events."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..events import FailureKind, SemanticEvent


@dataclass(frozen=True)
class Coupling:
    """A directed causal link: ``cause`` explains ``effect`` (``relation`` says how, e.g. "zeroes the
    gradient of")."""

    cause: SemanticEvent
    effect: SemanticEvent
    relation: str


@dataclass(frozen=True)
class CausalHypothesis:
    """One underlying fault: its root event, the events it explains, and what to do about it.

    ``chain`` starts with ``root`` and lists the explained events in causal order. ``confidence`` (in [0, 1])
    comes from the evidence: how far past its threshold the root is, how long it held, and how many other
    events it explains.
    """

    kind: FailureKind
    confidence: float
    root: SemanticEvent
    chain: list[SemanticEvent]
    explanation: str
    suggestion: str
    couplings: list[Coupling] = field(default_factory=list, repr=False, compare=False)

    @property
    def layer(self) -> str:
        return self.root.layer

    @property
    def step(self) -> int:
        return self.root.step_start

    def summary(self) -> str:
        """One line: kind, root layer and onset step, confidence."""
        where = f"'{self.root.layer}'" if self.root.layer else "the model"
        return f"{self.kind.value} at {where} from step {self.root.step_start} (confidence {self.confidence:.2f})"

    def __str__(self) -> str:
        return self.explanation
