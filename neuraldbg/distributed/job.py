"""The merged diagnosis of a distributed job, with the query API of one run.

:class:`JobRun` answers what a debugger or a loaded trace answers (``hypotheses()``, ``explain_failure()``,
``export_mermaid_causal_graph()``, ``to_dict()``, ``history``, ``layers``, ``steps``), so the pytest plugin's
assertions, gate and reports take it like any other run. Its hypotheses are the job's findings
(:class:`neuraldbg.distributed.merge.JobFinding`), most likely first, each explanation opening with the ranks that show
it ("<kind> at '3' from step 0 on all ranks. <its explanation on rank 0> ..."); a finding that rank 0 shows keeps rank
0's causal chain, one it does not show is rooted at an event rebuilt from the summary of the first rank that does. A
rank that sent no summary is a run-level ``incomplete_observation`` hypothesis: a job with a missing rank is never
verified healthy. Events, layers and history are rank 0's.

One causal link crosses ranks: gradients are averaged over the ranks (DDP's all-reduce, FSDP's reduce-scatter),
so non-finite values in the input batches of some ranks reach every rank's gradients, and then weights, in the
same step. Non-finite findings at or after the onset of a data-shard finding are its effects, listed in its
explanation and chain rather than as faults of their own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..events import SemanticEvent
from ..kinds import registry
from ..kinds.base import run_event
from ..queries import Queries
from ..reasoning.hypothesis import CausalHypothesis, Coupling
from ..reasoning.rules import CausalRule
from ..reasoning.topology import Topology
from ..text import ranks_text
from .gather import Gathered

if TYPE_CHECKING:
    from .merge import JobDiagnosis, JobFinding


class JobRun(Queries):
    """One diagnosis for a job, from rank 0's own run and every rank's summary (see the module docstring).

    ``job`` is the merged :class:`~neuraldbg.distributed.merge.JobDiagnosis` (``report()``, ``to_dict()``,
    ``verified``), ``gathered`` what rank 0 received.
    """

    attached = False

    def __init__(self, local: Queries, gathered: Gathered) -> None:
        from .merge import merge

        self._local = local
        self.gathered = gathered
        job = merge(gathered.summaries, gathered.world_size, gathered.reasons)
        notes = [f"Rank {r}: {note}" for r, note in sorted(gathered.notes.items())]
        job = dataclasses.replace(job, notes=[*job.notes, *notes]) if notes else job
        self._effects: dict[int, list[JobFinding]] = {}  # id of a data-shard finding -> what it caused elsewhere
        self.job = self._fold_shard_effects(job)
        self.history = local.history
        self._hypotheses: list[CausalHypothesis] | None = None
        self._extra: list[SemanticEvent] = []

    # --- what a run answers ---------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.job.world_size

    @property
    def missing(self) -> dict[int, str]:
        """Ranks that sent no summary, and why."""
        return dict(self.job.missing)

    @property
    def steps(self) -> int:
        """Steps observed on rank 0."""
        return int(getattr(self._local, "steps", 0))

    def _current(self) -> tuple[list[SemanticEvent], Topology, Sequence[CausalRule]]:
        events, topo, rules = self._local._current()
        self.hypotheses()
        return [*events, *self._extra], topo, rules

    def _meta(self) -> dict[str, Any]:
        meta = dict(self._local._meta())
        meta.pop("rank", None)  # the job's, not rank 0's
        meta["world_size"] = self.job.world_size
        meta["job"] = self.job.to_dict()
        return meta

    def report(self) -> str:
        """The job's report: verdict, each failure with the ranks that show it, the ranks that sent nothing."""
        return self.job.report()

    def hypotheses(self) -> list[CausalHypothesis]:
        if self._hypotheses is None:
            self._hypotheses = self._build()
        return list(self._hypotheses)

    # --- building ----------------------------------------------------------------------------------------------

    def _fold_shard_effects(self, job: JobDiagnosis) -> JobDiagnosis:
        """Findings caused by another rank's bad batch (of the same kind: non-finite values), through the averaged
        gradients."""
        shards = [f for f in job.findings if f.data_shard]
        if not shards:
            return job
        cause = min(shards, key=lambda f: min(f.onsets.values()))
        onset = min(cause.onsets.values())
        effects = [
            f for f in job.findings if f is not cause and f.kind is cause.kind and min(f.onsets.values()) >= onset
        ]
        if not effects:
            return job
        reached = "; ".join(f"{e.kind.value} at {e.where()} {e.onset()} {e.on_ranks()}" for e in effects)
        text = (
            f"{cause.explanation} Gradients are averaged over the ranks, so these {registry.room(cause.kind).title} "
            f"reached the other ranks in the same step: {reached}."
        )
        merged = dataclasses.replace(cause, explanation=text)
        self._effects[id(merged)] = effects
        findings = [merged if f is cause else f for f in job.findings if all(f is not e for e in effects)]
        return dataclasses.replace(job, findings=findings)

    def _build(self) -> list[CausalHypothesis]:
        local = self._local.hypotheses()
        out: list[CausalHypothesis] = []
        for finding in self.job.findings:
            ranks = f"{finding.line()}."
            note = finding.note()
            prefix = f"{ranks} {note}" if note else ranks
            own = next(
                (
                    h
                    for h in local
                    if 0 in finding.onsets
                    and h.kind is finding.kind
                    and h.root.layer == finding.layer
                    and h.root.event_type is finding.event_type
                ),
                None,
            )
            if own is not None:
                out.append(dataclasses.replace(own, explanation=f"{prefix} {own.explanation}"))
                continue
            root = _event_of(finding)
            self._extra.append(root)
            chain = [root]
            couplings = []
            for effect in self._effects.get(id(finding), ()):
                event = _event_of(effect)
                self._extra.append(event)
                chain.append(event)
                couplings.append(Coupling(root, event, "reaches, through the averaged gradients,"))
            text = f"{prefix} On rank {finding.explained_by}: {finding.explanation}"
            fix = finding.explanation.rsplit("Fix: ", 1)[1] if "Fix: " in finding.explanation else ""
            out.append(CausalHypothesis(finding.kind, finding.confidence, root, chain, text, fix, couplings))
        if self.job.missing:
            out.append(self._missing())
        return out

    def _missing(self) -> CausalHypothesis:
        """The ranks that sent nothing: a part of the job that was not observed (the kind that says so)."""
        missing = self.job.missing
        ranks = sorted(missing)
        detail = "; ".join(f"rank {r} {why}" for r, why in sorted(missing.items()))
        kind = registry.unobserved().kind
        root = run_event(kind, 0, 0, detail, missing_ranks=len(ranks), world_size=self.job.world_size)
        self._extra.append(root)
        fix = (
            f"look at the output of {ranks_text(ranks)} (did it fail, hang, or leave its block much later than "
            "rank 0?); raise gather_timeout if it was only slow."
        )
        text = (
            f"The job is not verified: {detail}. Its findings are unknown, so the job cannot be called healthy. "
            f"Fix: {fix}"
        )
        return CausalHypothesis(kind, 1.0, root, [root], text, fix)


def _event_of(finding: JobFinding) -> SemanticEvent:
    """An event standing for a finding of other ranks (at its earliest onset), rebuilt from their summaries."""
    step = min(finding.onsets.values())
    return SemanticEvent(
        event_type=finding.event_type,
        kind=finding.kind,
        layer=finding.layer,
        param=finding.param,
        step_start=step,
        step_end=step,
        from_state=None,
        to_state=finding.kind,
        metrics={"ranks": float(len(finding.onsets))},
        confidence=finding.confidence,
        detail=f"on {ranks_text(finding.ranks)}",
    )
