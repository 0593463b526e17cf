"""Text for humans: a one-line verdict, then each hypothesis' explanation and causal chain.

Everything here works on the plain dictionaries of :mod:`pytest_neuraldbg.records`, so a worker process, the
controller under pytest-xdist and the assertion helpers all print the same words. The first line of every
failure text is a verdict on its own: pytest cuts the JUnit ``message`` attribute at about 500 characters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from neuraldbg.events import FailureKind
from neuraldbg.text import one_line

from .records import HypothesisRecord

MAX_HEADLINE = 300


def kinds(also: Iterable[str] = ()) -> list[str]:
    """Every failure kind this process knows (the built-in ones and the plugins' registered so far, in the engine's
    order), then any other kind named in ``also`` (a kind a run reported whose plugin is not loaded here)."""
    # the engine's kinds, each in its room (no torch), imported when a verdict is first written, not with this module:
    # pytest imports it at startup, and a session that watches no run should not load every kind
    from neuraldbg.kinds import registry

    known = [k.value for k in FailureKind if registry.is_known(k)]
    return [*known, *dict.fromkeys(a for a in also if a not in known)]


def title(kind: str) -> str:
    """How a verdict names a kind ("dead neurons", "non-finite values"), as its room says."""
    from neuraldbg.kinds import registry  # (see kinds)

    return registry.room(kind).title


def run_level(kind: str) -> bool:
    """About the run as a whole (nothing trained, no gradient, eval mode, a loss that cannot teach, the debugger
    stopped observing): such a run cannot be called healthy, whatever its layers did."""
    from neuraldbg.kinds import registry  # (see kinds)

    return registry.room(kind).run_level


def headline(hypotheses: Sequence[HypothesisRecord], lead: str = "NeuralDBG: training is unhealthy") -> str:
    """``NeuralDBG: training is unhealthy - <kind> at '3' from step 0 (confidence 1.00)``."""
    if not hypotheses:
        return "NeuralDBG: training looks healthy"
    if len(hypotheses) == 1:
        return one_line(f"{lead} - {hypotheses[0]['summary']}", MAX_HEADLINE)
    listed = "; ".join(h["summary"] for h in hypotheses[:3])
    more = f"; +{len(hypotheses) - 3} more" if len(hypotheses) > 3 else ""
    return one_line(f"{lead} - {len(hypotheses)} failure hypotheses: {listed}{more}", MAX_HEADLINE)


def involves(hypothesis: HypothesisRecord, kinds: Sequence[str]) -> bool:
    """Whether a hypothesis has one of ``kinds`` as its root cause or among the events it explains."""
    return hypothesis["kind"] in kinds or any(e["kind"] in kinds for e in hypothesis["chain"])


def kind_headline(found: Sequence[HypothesisRecord], kinds: Sequence[str], what: str) -> str:
    """The verdict line of a check: ``NeuralDBG: vanishing gradients in '0', '2' from step 0, caused by ...``."""
    first = found[0]
    if first["kind"] in kinds:
        return headline(found, f"NeuralDBG: {what}")
    events = [e for e in first["chain"] if e["kind"] in kinds]
    places = ", ".join(dict.fromkeys(e["where"] for e in events))
    start = min(e["step_start"] for e in events)
    more = f" (+{len(found) - 1} more hypotheses)" if len(found) > 1 else ""
    return one_line(
        f"NeuralDBG: {what} in {places} from step {start}, caused by {first['summary']}{more}", MAX_HEADLINE
    )


def chain_lines(hypothesis: HypothesisRecord) -> list[str]:
    """The causal chain, root first: one line per event with its layer, states and steps."""
    lines = ["Causal chain (root first):"]
    for i, event in enumerate(hypothesis["chain"]):
        line = f"  {'root' if i == 0 else '  ->'} {event['text']}"
        if event.get("cause") is not None:
            line += f"  ({event['cause']} {event['relation']} {event['where']})"
        lines.append(line)
    return lines


def describe(hypothesis: HypothesisRecord, number: int | None = None) -> str:
    """Explanation and chain of one hypothesis, after a numbered summary line when ``number`` is given."""
    title = [] if number is None else [f"{number}. {hypothesis['summary']}"]
    return "\n".join([*title, hypothesis["explanation"], *chain_lines(hypothesis)])


def failure_text(first_line: str, hypotheses: Sequence[HypothesisRecord], footer: Iterable[str] = ()) -> str:
    """The full failure message: the verdict line, then every hypothesis in detail (numbered when several)."""
    numbered = len(hypotheses) > 1
    parts = [first_line, *(describe(h, i if numbered else None) for i, h in enumerate(hypotheses, 1))]
    return "\n\n".join([*parts, *footer])


def explanation(hypotheses: Sequence[HypothesisRecord]) -> str:
    """The explanations of a run, one per line (``""`` when healthy)."""
    return "\n".join(h["explanation"] for h in hypotheses)


class Explanations(list[str]):
    """``explain_failure()`` of a watched run: a list of strings whose repr is a readable verdict.

    pytest shows the repr of the value in ``assert not ndbg.explain_failure()``; this one reads
    ``<unhealthy training: <kind> at '3' from step 0 (confidence 1.00)>`` instead of a cut-off list.
    """

    def __init__(self, explanations: Iterable[str] = (), summaries: Sequence[str] = ()) -> None:
        super().__init__(explanations)
        self.summaries = list(summaries)

    def __repr__(self) -> str:
        return _verdict_repr(self.summaries) if self else "[]"


class Hypotheses(list[Any]):
    """``hypotheses()`` of a watched run: a list whose repr is a readable verdict, not dataclass dumps."""

    def __repr__(self) -> str:
        return _verdict_repr([h.summary() for h in self]) if self else "[]"


def _verdict_repr(summaries: Sequence[str]) -> str:
    if len(summaries) == 1:
        return f"<unhealthy training: {summaries[0]}>"
    return f"<unhealthy training, {len(summaries)} failure hypotheses: {'; '.join(summaries)}>"


def compare_lines(op: str, left: object, right: object) -> list[str] | None:
    """Lines for ``assert ndbg.explain_failure() == []``: the verdict and every explanation in full."""
    if op != "==":
        return None
    for found, other in ((left, right), (right, left)):
        if isinstance(found, Explanations) and found and isinstance(other, list) and not other:
            lines = [f"{_verdict_repr(found.summaries)} == []", "NeuralDBG found a training failure:"]
            return [*lines, *(f"  {i}. {text}" for i, text in enumerate(found, 1))]
    return None
