"""One diagnosis for a distributed job: bounded per-rank summaries, merged into one verdict.

Each rank reduces its diagnosis to a summary with :func:`summarize`: plain JSON-safe data (no tensors), bounded in
size (at most :data:`MAX_FINDINGS` findings, texts cut to :data:`MAX_TEXT` characters), cheap to send with
``torch.distributed.gather_object``. :func:`merge` takes the summaries by rank and says which ranks show each
fault: the same kind at the same root layer on the same signal is one fault, whatever its onset on each rank
("<kind> at '3' from step 0 on all ranks"; "non_finite: input batch at step 12 on rank 1 only - a data
shard problem"). A rank without a summary (it failed, or the gather timed out) is named, and a job with a
missing rank is never verified healthy.

Offline, :func:`merge_traces` does the same for traces saved on each rank (``neuraldbg explain DIR``); the rank
of a trace comes from ``meta.rank``, else from a file name as the distributed examples write it (``run.rank1.json``).
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, TraceError
from ..events import EventType, FailureKind, place
from ..kinds import registry
from ..queries import Queries
from ..text import cut, printable, rank_list, ranks_text

SUMMARY_FORMAT = "neuraldbg-rank-summary"
SUMMARY_VERSION = 1
MAX_FINDINGS = 32  # findings sent per rank, most likely first; the rest are counted, not sent
MAX_TEXT = 2000  # characters of an explanation sent per finding
MAX_NAME = 300  # characters of a layer or parameter name, a summary line, a source
#: Why a rank has no summary, unless the caller knows better.
NO_SUMMARY = "sent no summary (timed out or failed)"


# --- one rank ---------------------------------------------------------------------------------------------


def summarize(
    diagnosis: Queries, *, rank: int | None = None, world_size: int | None = None, source: str = ""
) -> dict[str, Any]:
    """A bounded, JSON-safe summary of one rank's diagnosis (a live debugger or a loaded trace).

    ``rank`` and ``world_size`` default to the run's ``meta`` (``None`` when it does not say). The result holds
    only strings, integers, finite floats, lists and dicts, so it pickles and serialises anywhere.
    """
    meta = diagnosis.meta
    rank = rank if rank is not None else _int_or_none(meta.get("rank"))
    world_size = world_size if world_size is not None else _int_or_none(meta.get("world_size"))
    hypotheses = diagnosis.hypotheses()
    findings = [
        {
            "kind": h.kind.value,
            "layer": cut(h.root.layer, MAX_NAME),
            "param": cut(h.root.param, MAX_NAME) if h.root.param is not None else None,
            "event_type": h.root.event_type.value,
            "step": h.root.step_start,
            "confidence": h.confidence,
            "summary": cut(h.summary(), MAX_NAME),
            "explanation": cut(h.explanation, MAX_TEXT),
        }
        for h in hypotheses[:MAX_FINDINGS]
    ]
    backend = meta.get("backend")
    return {
        "format": SUMMARY_FORMAT,
        "version": SUMMARY_VERSION,
        "rank": rank,
        "world_size": world_size,
        "backend": cut(backend, MAX_NAME) if isinstance(backend, str) else None,
        "model": cut(str(meta.get("model", "")), MAX_NAME),
        "steps_observed": _int_or_none(meta.get("steps_observed")) or 0,
        "last_step": _int_or_none(meta.get("last_step")),
        "findings": findings,
        "findings_left_out": len(hypotheses) - len(findings),
        "source": cut(source, MAX_NAME),
    }


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class _Finding:
    kind: FailureKind
    layer: str
    param: str | None
    event_type: EventType
    step: int
    confidence: float
    summary: str
    explanation: str


@dataclass(frozen=True)
class _Summary:
    steps_observed: int
    findings: list[_Finding]
    left_out: int
    source: str
    model: str


class _Malformed(Exception):
    pass


def _check(raw: Any, rank: int) -> _Summary:
    """A summary received from another process, checked field by field (it is data, not trusted code)."""

    def need(obj: Any, key: str, kinds: type | tuple[type, ...], where: str) -> Any:
        if not isinstance(obj, Mapping) or key not in obj:
            raise _Malformed(f"{where}{key} is missing")
        value = obj[key]
        if not isinstance(value, kinds) or (isinstance(value, bool) and kinds is not bool):
            raise _Malformed(f"{where}{key} is {type(value).__name__}")
        return value

    if not isinstance(raw, Mapping) or raw.get("format") != SUMMARY_FORMAT:
        raise _Malformed(f"not a {SUMMARY_FORMAT} (got {type(raw).__name__})")
    if raw.get("version") != SUMMARY_VERSION:
        raise _Malformed(f"summary version {raw.get('version')!r:.20}, expected {SUMMARY_VERSION}")
    if raw.get("rank") is not None and raw.get("rank") != rank:
        raise _Malformed(f"it says it comes from rank {raw.get('rank')!r:.20}")
    found = need(raw, "findings", list, "")
    if len(found) > MAX_FINDINGS:
        raise _Malformed(f"{len(found)} findings, more than {MAX_FINDINGS}")
    findings = []
    for i, item in enumerate(found):
        at = f"findings[{i}]."
        try:
            kind = FailureKind.declare(need(item, "kind", str, at))  # a plugin's kind is named, not refused
            event_type = EventType(need(item, "event_type", str, at))
        except ValueError as exc:
            raise _Malformed(f"{at}: {exc}") from None
        step = need(item, "step", int, at)
        confidence = need(item, "confidence", (int, float), at)
        if step < 0 or not (0.0 <= confidence <= 1.0):
            raise _Malformed(f"{at} step {step!r:.20} or confidence {confidence!r:.20} out of range")
        param = item.get("param")
        if param is not None and not isinstance(param, str):
            raise _Malformed(f"{at}param is {type(param).__name__}")
        findings.append(
            _Finding(
                kind,
                cut(need(item, "layer", str, at), MAX_NAME),
                cut(param, MAX_NAME) if param is not None else None,
                event_type,
                step,
                float(confidence),
                cut(need(item, "summary", str, at), MAX_NAME),
                cut(need(item, "explanation", str, at), MAX_TEXT),
            )
        )
    left_out = need(raw, "findings_left_out", int, "")
    steps = need(raw, "steps_observed", int, "")
    if left_out < 0 or steps < 0:
        raise _Malformed("negative counts")
    source = raw.get("source")
    model = raw.get("model")
    return _Summary(
        steps,
        findings,
        left_out,
        cut(source, MAX_NAME) if isinstance(source, str) else "",
        cut(model, MAX_NAME) if isinstance(model, str) else "",
    )


# --- the job ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobFinding:
    """One fault of the job: the ranks that show it, and each one's onset step.

    ``explanation`` is the explanation written on the first rank that shows it (``explained_by``); the others
    differ at most in their numbers.
    """

    kind: FailureKind
    layer: str
    param: str | None
    event_type: EventType
    onsets: dict[int, int]  # rank -> onset step, for every rank that shows the fault
    confidence: float  # the highest over the ranks
    explanation: str
    explained_by: int
    world_size: int
    missing: tuple[int, ...] = ()  # ranks that sent nothing: whether they show it is unknown

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.onsets))

    @property
    def on_all_ranks(self) -> bool:
        return len(self.onsets) == self.world_size

    @property
    def from_data(self) -> bool:
        """A finding its kind puts on the data (non-finite values in the input batch), not on the model."""
        return registry.room(self.kind).from_data(self.event_type)

    @property
    def data_shard(self) -> bool:
        """A data problem on some ranks but not others: their data shards differ."""
        reported = self.world_size - len(self.missing)
        return self.from_data and 0 < len(self.onsets) < reported

    def where(self) -> str:
        """What failed: "'3'", "'0.weight'", "the input batch", "the loss", "the model"."""
        return place(self.layer, self.param or None, self.event_type)

    def on_ranks(self) -> str:
        """ "on all ranks", "on rank 1 only", "on ranks 0, 2", "on every rank that reported (0, 1)"."""
        ranks = self.ranks
        if self.on_all_ranks:
            return "on rank 0" if self.world_size == 1 else "on all ranks"
        if self.missing and len(ranks) + len(self.missing) == self.world_size:
            if len(ranks) == 1:
                return f"on rank {ranks[0]}, the only rank that reported"
            return f"on every rank that reported ({rank_list(ranks)})"
        return f"on rank {ranks[0]} only" if len(ranks) == 1 else f"on ranks {rank_list(ranks)}"

    def onset(self) -> str:
        """ "from step 0" when every rank agrees, else each rank's onset (the first 8)."""
        word = "at" if self.event_type is EventType.INPUT else "from"
        steps = set(self.onsets.values())
        if len(steps) == 1:
            return f"{word} step {steps.pop()}"
        shown = [f"step {self.onsets[r]} on rank {r}" for r in self.ranks[:8]]
        more = f" and {len(self.ranks) - 8} more ranks" if len(self.ranks) > 8 else ""
        return f"{word} " + ", ".join(shown) + more

    def line(self) -> str:
        """One line: kind, where, onset, ranks ("non_finite: input batch at step 12 on rank 1 only - ...")."""
        if self.event_type is EventType.INPUT:
            text = f"{self.kind.value}: {self.where()} {self.onset()} {self.on_ranks()}"
        else:
            text = f"{self.kind.value} at {self.where()} {self.onset()} {self.on_ranks()}"
        if self.data_shard:
            text += " - a data shard problem"
        return text

    def note(self) -> str:
        """What the spread over ranks says about the cause ("" when it says nothing more)."""
        ranks = self.ranks
        title = registry.room(self.kind).title
        if self.data_shard:
            first = min(self.onsets.values())
            others = "the other ranks that reported" if self.missing else "the other ranks"
            return (
                f"Only the input batches of {ranks_text(ranks)} held {title}; {others} read clean "
                f"batches. The data, not the model, is at fault: look at the samples {ranks_text(ranks)} read "
                f"around step {first} (its shard of the dataset)."
            )
        if self.from_data and len(ranks) > 1:
            return (
                f"Every rank that reported read {title}: the dataset or its preprocessing is at fault, not one shard."
            )
        reported = self.world_size - len(self.missing)
        if 0 < len(ranks) < reported:
            among = f"the {reported} ranks that reported" if self.missing else f"{reported}"
            return (
                f"Only {ranks_text(ranks)} of {among} {'shows' if len(ranks) == 1 else 'show'} it. Under data "
                "parallelism every rank holds the same weights, so what differs between the ranks (their data "
                "shards, rank-specific code or devices) is the likely cause."
            )
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "layer": self.layer,
            "param": self.param,
            "event_type": self.event_type.value,
            "ranks": list(self.ranks),
            "onsets": {str(r): s for r, s in sorted(self.onsets.items())},
            "on_all_ranks": self.on_all_ranks,
            "data_shard": self.data_shard,
            "confidence": self.confidence,
            "line": self.line(),
            "note": self.note(),
            "explanation": self.explanation,
            "explained_by": self.explained_by,
        }


@dataclass(frozen=True)
class RankInfo:
    """What a rank reported about itself."""

    rank: int
    steps_observed: int
    findings: int  # findings sent
    left_out: int  # findings not sent (over MAX_FINDINGS)
    source: str = ""
    model: str = ""


@dataclass(frozen=True)
class JobDiagnosis:
    """The merged diagnosis of a job: findings with the ranks that show them, and the ranks that sent nothing."""

    world_size: int
    findings: list[JobFinding]
    reported: dict[int, RankInfo]
    missing: dict[int, str]  # rank -> why it has no summary
    notes: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        """Whether every rank of the job reported."""
        return not self.missing

    @property
    def healthy(self) -> bool:
        """Verified healthy: every rank reported, and none shows a failure."""
        return self.verified and not self.findings

    def verdict(self) -> str:
        n = self.world_size
        ranks = f"{n} rank{'s' if n != 1 else ''}"
        if self.findings:
            kinds = ", ".join(dict.fromkeys(f.kind.value for f in self.findings))
            count = len(self.findings)
            text = (
                f"NeuralDBG job: UNHEALTHY - {count} failure{'s' if count > 1 else ''} ({kinds}) on a job of {ranks}."
            )
        elif self.missing:
            text = (
                f"NeuralDBG job: NOT VERIFIED - {ranks_text(sorted(self.missing))} of {n} sent no summary; "
                f"no failure on {ranks_text(sorted(self.reported)) if self.reported else 'any rank'}."
            )
        else:
            text = f"NeuralDBG job: healthy - no training failure on any of the {ranks}."
        return text

    def missing_lines(self) -> list[str]:
        return [f"Rank {r} {why}: its findings are unknown." for r, why in sorted(self.missing.items())]

    def report(self, width: int = 100) -> str:
        """The terminal report: verdict, one paragraph per fault, the missing ranks, what each rank observed."""
        lines = [self.verdict()]
        for i, f in enumerate(self.findings, start=1):
            lines.append("")
            lines.append(f"{i}. {f.line()} (confidence {f.confidence:.2f})")
            for text in (f.note(), f"On rank {f.explained_by}: {f.explanation}"):
                if text:
                    lines.extend(textwrap.wrap(text, width=width, initial_indent="   ", subsequent_indent="   "))
        tail = [*self.missing_lines(), *self.notes]
        for r, info in sorted(self.reported.items()):
            if info.left_out:
                tail.append(f"Rank {r} had {info.left_out} more findings than it could send ({MAX_FINDINGS} at most).")
        if tail:
            lines.append("")
            lines.extend(tail)
        lines.append("")
        lines.append(
            "Ranks: "
            + "; ".join(
                f"{r}: {info.steps_observed} steps" + (f" ({info.source})" if info.source else "")
                for r, info in sorted(self.reported.items())
            )
            if self.reported
            else "Ranks: none reported"
        )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "healthy": self.healthy,
            "verified": self.verified,
            "verdict": self.verdict(),
            "findings": [f.to_dict() for f in self.findings],
            "missing": {str(r): why for r, why in sorted(self.missing.items())},
            "ranks": {
                str(r): {
                    "steps_observed": info.steps_observed,
                    "findings": info.findings,
                    "findings_left_out": info.left_out,
                    "source": info.source,
                    "model": info.model,
                }
                for r, info in sorted(self.reported.items())
            },
            "notes": list(self.notes),
        }

    def export_mermaid(self) -> str:
        """A Mermaid flowchart: groups of ranks, the faults they show, and the ranks that sent nothing."""
        from .graph import job_graph

        return job_graph(self)


def merge(
    summaries: Mapping[int, Mapping[str, Any] | None],
    world_size: int,
    reasons: Mapping[int, str] | None = None,
) -> JobDiagnosis:
    """Merge per-rank summaries (from :func:`summarize`) into one diagnosis of the job.

    ``summaries`` maps each rank that answered to its summary; a rank of ``range(world_size)`` that is absent or
    maps to ``None`` is missing, with ``reasons[rank]`` (default: :data:`NO_SUMMARY`) saying why. A summary that
    is malformed counts as missing too, with what is wrong with it: a rank's bad data never stops the merge.
    Raises :class:`~neuraldbg.ConfigError` (a ``ValueError``) only for a bad ``world_size`` or a rank outside
    ``range(world_size)``.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"merge(): world_size must be an integer >= 1, got {world_size!r}")
    outside = [r for r in summaries if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world_size]
    if outside:
        raise ConfigError(f"merge(): rank {outside[0]!r} is outside range({world_size})")
    reasons = reasons or {}
    checked: dict[int, _Summary] = {}
    missing: dict[int, str] = {}
    for rank in range(world_size):
        raw = summaries.get(rank)
        if raw is None:
            missing[rank] = cut(str(reasons.get(rank) or NO_SUMMARY), MAX_NAME)
            continue
        try:
            checked[rank] = _check(raw, rank)
        except _Malformed as exc:
            missing[rank] = f"sent a malformed summary ({cut(str(exc), MAX_NAME)})"
    groups: dict[tuple[FailureKind, str, EventType], dict[int, _Finding]] = {}
    for rank, summary in checked.items():
        for finding in summary.findings:
            key = (finding.kind, finding.layer, finding.event_type)
            earlier = groups.setdefault(key, {}).get(rank)
            if earlier is None or finding.step < earlier.step:  # the same fault twice on a rank: its first onset
                groups[key][rank] = finding
    findings = []
    for (kind, layer, event_type), by_rank in groups.items():
        first = min(by_rank)
        findings.append(
            JobFinding(
                kind=kind,
                layer=layer,
                param=by_rank[first].param,
                event_type=event_type,
                onsets={r: f.step for r, f in sorted(by_rank.items())},
                confidence=max(f.confidence for f in by_rank.values()),
                explanation=by_rank[first].explanation,
                explained_by=first,
                world_size=world_size,
                missing=tuple(sorted(missing)),
            )
        )
    findings.sort(key=lambda f: (-f.confidence, min(f.onsets.values()), f.kind.value, f.layer))
    reported = {
        r: RankInfo(r, s.steps_observed, len(s.findings), s.left_out, s.source, s.model) for r, s in checked.items()
    }
    return JobDiagnosis(world_size, findings, reported, missing)


# --- saved traces -----------------------------------------------------------------------------------------

#: How a rank's trace is named where NeuralDBG and its documentation save one (``dbg.save(f"run.rank{rank}.json")``):
#: ``rank<N>`` as the last dotted part before ``.json``. A name that merely holds "rank_2" somewhere (a test
#: ``test_low_rank_2`` in a report folder) is not a rank's trace.
_RANK_TRACE_NAME = re.compile(r"(?:\A|\.)rank(\d{1,9})\.json\Z")


def stated_rank(trace: Any) -> int | None:
    """The rank of the job that wrote ``trace`` (an object with ``.meta`` and ``.source``), or None for a trace
    of a run on its own.

    A run under ``torch.distributed`` records its rank in ``meta.rank``, which is trusted first; a trace without
    it (saved by a run that was not initialised as a rank) counts as a rank's only when named as the distributed
    examples name one, ``NAME.rank<N>.json``, so that a folder of separate runs whose names hold "rank_2" is not
    taken for a job.
    """
    rank = _int_or_none(trace.meta.get("rank"))
    if rank is not None:
        return rank
    found = _RANK_TRACE_NAME.search(os.path.basename(str(trace.source)))
    return int(found.group(1)) if found else None


def merge_traces(traces: Sequence[Any]) -> JobDiagnosis:
    """Merge traces saved on each rank of a job (objects with ``.source`` and ``.meta``: :class:`~neuraldbg.Trace`).

    A trace's rank is what :func:`stated_rank` says (``meta.rank``, else a name like ``run.rank1.json``); the
    job's size is ``meta.world_size`` (which every trace that states it must agree on), else one more than the
    highest rank. Ranks below it with no trace are missing. Raises :class:`~neuraldbg.TraceError` (one line,
    naming the files) when a trace's rank cannot be told, two traces claim the same rank, or the traces disagree
    on the job's size.
    """
    if not traces:
        raise TraceError("no trace to merge")
    by_rank: dict[int, Any] = {}
    sizes: dict[int, str] = {}
    for trace in traces:
        meta = trace.meta
        rank = stated_rank(trace)
        if rank is None:
            raise TraceError(
                f"{printable(trace.source)}: cannot tell which rank wrote this trace: it has no meta.rank and "
                "its file name is not a rank's (name it like run.rank0.json)"
            )
        if rank in by_rank:
            raise TraceError(
                f"{printable(trace.source)}: claims rank {rank}, like {printable(by_rank[rank].source)}: "
                "one trace per rank is expected"
            )
        by_rank[rank] = trace
        size = _int_or_none(meta.get("world_size"))
        if size is not None:
            sizes.setdefault(size, trace.source)
    if len(sizes) > 1:
        (a, sa), (b, sb) = sorted(sizes.items())[:2]
        raise TraceError(
            f"{printable(sb)}: says the job has {b} ranks, but {printable(sa)} says {a}: these traces are not one job"
        )
    world_size = next(iter(sizes)) if sizes else max(by_rank) + 1
    beyond = [r for r in by_rank if r >= world_size]
    if beyond:
        raise TraceError(
            f"{printable(by_rank[beyond[0]].source)}: rank {beyond[0]} is not below the job's size {world_size}"
        )
    summaries = {
        r: summarize(t, rank=r, world_size=world_size, source=str(t.source)) for r, t in sorted(by_rank.items())
    }
    reasons = {r: "has no trace (it failed, or its trace was not saved)" for r in range(world_size)}
    return merge(summaries, world_size, reasons)


__all__ = [
    "MAX_FINDINGS",
    "MAX_TEXT",
    "NO_SUMMARY",
    "JobDiagnosis",
    "JobFinding",
    "RankInfo",
    "merge",
    "merge_traces",
    "stated_rank",
    "summarize",
]
