"""A distributed job as a Mermaid flowchart: groups of ranks, the faults they show, and the ranks that sent nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..export.mermaid import CLASSES, Nodes, escape, label
from ..kinds import registry
from ..text import ranks_text

if TYPE_CHECKING:
    from .merge import JobDiagnosis

#: Faults drawn in a job graph; the rest are counted in one node.
MAX_JOB_FINDINGS = 24


def job_graph(job: JobDiagnosis) -> str:
    """A flowchart of a distributed job: each group of ranks points at the faults it shows; ranks that sent
    nothing are dashed nodes, ranks without a fault one green node."""
    lines = [
        "flowchart LR",
        *CLASSES,
        "  classDef missing fill:#ffffff,stroke:#7f8c8d,stroke-dasharray:5 5,color:#000",
    ]
    nodes = Nodes(lines)
    group_node: dict[tuple[int, ...], str] = {}

    def node(text: str, css: str) -> str:
        return nodes.add(text, css, "  ")

    def ranks_label(ranks: tuple[int, ...]) -> str:
        if len(ranks) == job.world_size and job.world_size > 1:
            return "both ranks" if job.world_size == 2 else f"all {job.world_size} ranks"
        return ranks_text(ranks)

    edges: list[str] = []
    for f in job.findings[:MAX_JOB_FINDINGS]:
        if f.ranks not in group_node:
            group_node[f.ranks] = node(label(ranks_label(f.ranks)), "evidence")
        css = "critical" if registry.room(f.kind).acute else "root"
        shard = "a data shard problem" if f.data_shard else ""
        target = node(label(f.kind.value, f.where(), shard), css)
        edges.append(f'  {group_node[f.ranks]} -->|"{escape(f.onset())}"| {target}')
    hidden = len(job.findings) - MAX_JOB_FINDINGS
    if hidden > 0:
        node(label(f"… {hidden} more faults (see the text report)"), "evidence")
    faulty = {r for f in job.findings for r in f.ranks}
    clean = tuple(sorted(r for r in job.reported if r not in faulty))
    if clean:
        node(label(ranks_label(clean), "no failure"), "healthy")
    for rank, why in sorted(job.missing.items())[:MAX_JOB_FINDINGS]:
        node(label(f"rank {rank}", why, "findings unknown"), "missing")
    if len(job.missing) > MAX_JOB_FINDINGS:
        node(label(f"… {len(job.missing) - MAX_JOB_FINDINGS} more ranks sent nothing"), "missing")
    lines.extend(edges)
    lines += nodes.class_lines()
    return "\n".join(lines)
