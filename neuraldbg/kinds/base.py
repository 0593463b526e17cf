"""What a failure kind is made of: the contract every room of :mod:`neuraldbg.kinds` fills in, plugins' included.

A :class:`Kind` holds everything about one kind of training failure:

* what finds it: its detectors (:meth:`Kind.detectors`), and for a finding about the run as a whole, the check over
  what was observed (:meth:`Kind.run_finding`);
* what it is made of: the health states that are this kind (``states``) and the kind-less evidence it owns
  (``evidence``, such as outputs blowing up for an explosion);
* where it stands among root causes (:meth:`Kind.lane`, :meth:`Kind.choose_root`) and in the ranking (``tier``);
* the causal rules in which it is the cause (:meth:`Kind.rules`);
* its words: the explanation with the fix (:meth:`Kind.explain`), an event in words (:meth:`Kind.describe`), a
  Mermaid node (:meth:`Kind.label`), what it caused (:meth:`Kind.effect`), how a verdict names it (``title``);
* what the pytest plugin needs (``check``).

The engine, the exporters, traces, the distributed merge and the plugin ask a kind through the registry
(:mod:`neuraldbg.kinds.registry`); none of them names another kind's members. A plugin adds a kind by registering
an instance of its own subclass (see :mod:`neuraldbg.plugins.hookspecs`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..events import EventType, FailureKind, SemanticEvent
from ..health import HealthState
from ..text import num, span

if TYPE_CHECKING:
    from ..capture.coverage import Coverage, RunFacts
    from ..config import DebugConfig
    from ..detectors.base import Detector
    from ..reasoning.rules import CausalRule
    from ..reasoning.topology import Topology

#: A run's recorded series: ``series(metric, layer)`` -> ``[(step, value), ...]`` (empty when not recorded).
Series = Callable[[str, str], list[tuple[int, float]]]


@dataclass(frozen=True)
class RootLane:
    """Where an event stands when the engine picks the next root cause.

    Lower ``rank`` first: among the lanes of one rank, the earliest onset wins, then the lower ``order``; within a
    lane, events come by onset, then forward position (the most downstream first when ``last_first``: a gradient
    that vanishes from there back to the input). The built-in ranks: 0 run-level findings, 1 a non-finite input
    batch, 2 acute failures (explosions, non-finite values: the earliest wins), 3 dead units, 4 saturation, 5
    frozen parameters, 6 vanishing gradients, 7 stalled updates, 8 any other kind (:data:`LAST_RANK`), 9 updates as
    large as the weights that caused nothing else.
    """

    rank: float
    order: int = 0
    last_first: bool = False


#: Where a kind that does not say otherwise stands among root causes: after every built-in fault.
LAST_RANK = 8.0


@dataclass(frozen=True)
class Check:
    """How the pytest plugin checks a kind: the assertion helper that fails on it, the words of that helper's
    verdict line, the history series a helper's ``max_fraction`` applies to (``""``: none) and what a fraction
    above it means (``{where}`` stands for the layer)."""

    helper: str = "assert_healthy"
    what: str = ""
    fraction: str = ""
    fraction_words: str = ""


class RootPool(Protocol):
    """What :meth:`Kind.choose_root` may ask of the engine's pool of unclaimed events."""

    topo: Topology

    def first_evidence(self, state: HealthState, layer: str | None = None) -> SemanticEvent | None:
        """The first unclaimed kind-less event in ``state`` present from the first step: the first in forward
        order, or the first in time in ``layer`` when given."""


class Kind:
    """Base class of a room: set ``name`` (and ``title``), override what the kind needs. See the module docstring.

    Every method has a default that makes a sound kind of a plugin's findings: they become root causes after the
    built-in faults, explained in generic words with their numbers.
    """

    #: The kind's stable name (``"zero_output"``); its :class:`~neuraldbg.events.FailureKind` is declared from it.
    name: str = ""
    #: How a verdict names it ("dead neurons"); default: the name with spaces.
    title: str = ""
    #: About the run as a whole (what was observed of it) rather than a layer's health.
    run_level: bool = False
    #: About what was observed, not about the training: alone, such findings make a run inconclusive.
    inconclusive: bool = False
    #: Ranking of its hypotheses: 0 nothing can be learned, 1 a fault, 2 a caveat about what was observed.
    tier: int = 1
    #: Drawn as critical in graphs (values blowing up).
    acute: bool = False
    #: The health states that are this kind (a detector's finding in one of them is an event of this kind).
    states: tuple[HealthState, ...] = ()
    #: Kind-less states this kind owns as evidence: events that only explain its failures.
    evidence: tuple[HealthState, ...] = ()
    #: May be set off in mid-run by a learning rate too high (then later surges at that rate are the same fault).
    lr_sensitive: bool = False
    #: What a learning rate too high does to the layers: when it began long after updates as large as the weights
    #: (that made the fit worse) had come and gone at the learning rate still in force then, the learning rate is
    #: the fault, rooted at the first such surge, and this failure one of its consequences (one set off by a surge,
    #: while or right after it, stays the hypothesis and names the learning rate: see the reasoning engine).
    surge_victim: bool = False
    #: Its findings are how faults show in the loss (it does not fall, it climbs, it stays at chance): any fault of
    #: the run that began before such a finding ended explains it.
    loss_symptom: bool = False
    #: Its findings that begin after another fault are how that fault shows in the loss (it explains them).
    late_loss_symptom: bool = False
    #: Its explanation lists the other events of its own kind: they are part of the fault, not its effects.
    lists_own: bool = False
    #: States whose open runs a failure that follows in the same layer (or a non-finite value anywhere) confirms.
    confirmed_by_escalation: tuple[HealthState, ...] = ()
    #: Its findings confirm the open runs that :attr:`confirmed_by_escalation` names: a decisive one (a NaN) at once,
    #: another when it begins a new state while they are open (units dying or saturating during an explosion).
    confirms_escalation: bool = False
    #: The kind that says a part of the run was not observed (a distributed job names its missing ranks with it).
    unobserved: bool = False
    #: Metrics a trace must hold as counts (finite, >= 0).
    count_metrics: frozenset[str] = frozenset()
    #: What the pytest plugin needs.
    check: Check = Check()

    def __init__(self) -> None:
        if not self.name:
            raise TypeError(f"{type(self).__name__}: a Kind needs a name")
        self.kind = FailureKind.declare(self.name)
        if not self.title:
            self.title = self.name.replace("_", " ")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # --- what finds it -----------------------------------------------------------------------------------

    def detectors(self, config: DebugConfig) -> list[Detector]:
        """Fresh detectors for a new debugger (none: its findings come from elsewhere, e.g. a plugin's detector)."""
        return []

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        """For a run-level kind: its finding over what was observed of the run so far, or None. A layer kind that
        overrides it is asked too (a judgement of the whole run besides its layers' states)."""
        return None

    def undone(self, event: SemanticEvent, coverage: Coverage, facts: RunFacts) -> bool:
        """Whether the rest of the run undid ``event`` (a finding of this kind, or evidence it owns): what it
        harmed came back, and better, so it is no failure (default: never). Asked of every event each time the
        events are read, so a finding still open, or undone only later, is judged on the run so far."""
        return False

    # --- where it stands ---------------------------------------------------------------------------------

    def lane(self, event: SemanticEvent) -> RootLane | None:
        """Where ``event`` (of this kind, or evidence it owns) stands among root causes; None: never a root."""
        return RootLane(LAST_RANK) if event.kind is self.kind else None

    def choose_root(self, head: SemanticEvent, pool: RootPool) -> SemanticEvent:
        """The root of the hypothesis whose lane ``head`` leads (``head`` itself unless the kind knows better, as
        an explosion present from the start does: the layer whose outputs blow up first)."""
        return head

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        """Whether updates as large as the weights may have set ``root`` off (a data problem cannot be)."""
        return not self.run_level

    def rules(self) -> list[CausalRule]:
        """The causal rules in which this kind is the cause."""
        return []

    def from_data(self, event_type: EventType) -> bool:
        """Whether a finding of this kind on ``event_type`` is the data's doing rather than the model's (in a
        distributed job, a data problem on some ranks only is a data-shard problem)."""
        return False

    # --- words -------------------------------------------------------------------------------------------

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        """``(what happened, the fix)`` for a hypothesis rooted at ``root``; ``rest`` is what else it explains."""
        metrics = ", ".join(f"{k} {num(v)}" for k, v in root.metrics.items())
        what = f"{self.title.capitalize()} in {topo.describe(root.layer)} {held(root, topo)}"
        return what + (
            f" ({metrics})." if metrics else "."
        ), f"see the documentation of the plugin that adds {self.name!r}."

    def describe(self, event: SemanticEvent) -> str:
        """What held, with the number that shows it (``str(event)`` puts the place and the steps around it)."""
        words = str(event.to_state).replace("_", " ")
        if event.kind is None or event.kind.value == str(event.to_state):
            return words
        return f"{event.kind.value.replace('_', ' ')} ({words})"

    def label(self, event: SemanticEvent) -> str:
        """A few words with the key number for a graph node (``dead: 100% of 64 units``)."""
        return self.describe(event)

    def effect(self, event: SemanticEvent) -> str:
        """How an explanation names events like this one among what a fault caused ("dead units")."""
        return f"{event.to_state} {event.event_type.value}"

    def place(self, event: SemanticEvent) -> str:
        """Where ``event`` held, in words (``event.where`` unless the kind knows a better word)."""
        return event.where


class Unregistered(Kind):
    """A kind nobody registered in this process: read from a trace written with a plugin that is not installed.
    It is reported by its name, with generic words."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__()


# --- helpers the rooms' writers share -------------------------------------------------------------------


def held(e: SemanticEvent, topo: Topology | None = None) -> str:
    """'from step 0 to 49'; for a state still holding at the end, how far it was measured."""
    last = topo.last_step if topo is not None else -1
    if e.metrics.get("ongoing") and last >= e.step_end:
        if last == e.step_end:
            return f"from step {e.step_start} to the end of the run (step {last})"
        # cheap steps do not measure every state: say what was seen, and that nothing after it said otherwise
        return f"from step {e.step_start} until the run ended at step {last} (measured up to step {e.step_end})"
    if e.step_start == e.step_end:
        return f"at step {e.step_start}"
    return f"from step {e.step_start} to {e.step_end}"


def loss_ends(coverage: Coverage) -> dict[str, float]:
    """The run's first and last recorded losses as event metrics (``first_loss``, ``last_loss``), for an explanation
    that says where the loss went; empty when none was recorded."""
    trace = coverage.losses
    if trace.first and trace.last is not None:
        return {"first_loss": trace.first[0][1], "last_loss": trace.last[1]}
    return {}


def run_event(kind: FailureKind, start: int, end: int, detail: str = "", /, **metrics: float) -> SemanticEvent:
    """A finding about the run as a whole (layer ``""``, its kind as its state), with its numbers as metrics."""
    return SemanticEvent(
        event_type=EventType.RUN,
        kind=kind,
        layer="",
        param=None,
        step_start=start,
        step_end=max(start, end),
        from_state=None,
        to_state=kind,
        metrics={k: float(v) for k, v in metrics.items()},
        confidence=1.0,
        detail=detail,
    )


def layer_event(
    kind: FailureKind,
    layer: str,
    start: int,
    end: int,
    metrics: dict[str, float],
    detail: str = "",
    *,
    event_type: EventType | None = None,
    confidence: float = 1.0,
) -> SemanticEvent:
    """A run-level finding that names a layer (the one whose output the program's structure is about), its kind as
    its state; seen on that layer's output, or on the loss when no watched layer is named, unless ``event_type``
    says otherwise."""
    if event_type is None:
        event_type = EventType.ACTIVATION if layer else EventType.LOSS
    return SemanticEvent(
        event_type=event_type,
        kind=kind,
        layer=layer,
        param=None,
        step_start=start,
        step_end=max(start, end),
        from_state=None,
        to_state=kind,
        metrics={k: float(v) for k, v in metrics.items()},
        confidence=confidence,
        detail=detail,
    )


def steps_of(e: SemanticEvent) -> str:
    """``step 3`` or ``steps 0-32``, and ", still so at the last check" for a state that held to the end."""
    return span(e.step_start, e.step_end) + (", still so at the last check" if e.metrics.get("ongoing") else "")


def near(series: Series | None, metric: str, layer: str, step: int) -> float | None:
    """The recorded value of ``metric`` at ``layer`` nearest to ``step``, if it was recorded."""
    if series is None:
        return None
    points = series(metric, layer)
    if not points:
        return None
    return min(points, key=lambda p: abs(p[0] - step))[1]


__all__ = [
    "LAST_RANK",
    "Check",
    "Kind",
    "RootLane",
    "RootPool",
    "Series",
    "Unregistered",
    "held",
    "near",
    "run_event",
    "steps_of",
]
