"""What the reasoning produces: ranked causal hypotheses and the causal links between events."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..events import EventType, FailureKind, SemanticEvent
from ..kinds import registry


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

    ``chain`` starts with ``root`` and lists every event the fault accounts for, in order of onset: the events
    it caused, each linked to its cause by one of ``couplings``, and the events that are part of the fault
    itself, which have no coupling (other parameters frozen the same way, a layer's later state in the same
    layer, updates as large as the weights at the same learning rate). ``confidence`` (in [0, 1]) comes from
    the evidence: how far past its threshold the root is, how long it held, and how many other events it
    explains.
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
        """One line: kind, root layer (for a finding about a layer) and onset step, confidence."""
        root = self.root
        if registry.room(self.kind).run_level:
            at = ""
        elif root.layer:
            at = f" at '{root.layer}'"
        elif root.event_type in (EventType.INPUT, EventType.LOSS):
            at = f" at {root.where}"  # the input batch, the loss
        else:
            at = " at the model"
        return f"{self.kind.value}{at} from step {self.root.step_start} (confidence {self.confidence:.2f})"

    def __str__(self) -> str:
        return self.explanation
