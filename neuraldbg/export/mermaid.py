"""Mermaid flowcharts of causal chains that render for any layer name.

Rendering rules found by running real Mermaid: node ids are ``n0 … nN`` only (never a layer name: ``end`` or a
keyword breaks the parse); every label is quoted; inside labels ``#`` is escaped first, then ``"``, ``<``, ``>``
and the backtick become Mermaid entities; line breaks are ``<br>``. Mermaid looks for ``%%{...}%%`` directives
anywhere in the source, quoted labels included, before it parses: ``%%{init: {'theme': 'dark'}}%%`` in a layer
name restyles the graph, a ``themeCSS`` key puts its CSS into the SVG, and a lone ``%%{`` breaks the parse. Every
``%`` next to another ``%`` becomes ``#37;``, so no directive (and no ``%%`` comment) can form; a single ``%``
("100% of 64 units") stays readable. Other sequences (``:::``, ``@{``, ``-->``, ``end``, ``click``, ``&``, ``|``,
``;``, ``---`` and newlines) were tried in quoted labels and edge labels and are inert.

Mermaid refuses more than 500 edges and silently draws an error image past 50,000 characters, so large chains are
summarised (layers in the same state become one node) until the graph fits.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..events import EventType, FailureKind, SemanticEvent
from ..reasoning import words
from ..reasoning.explain import num, pct
from ..reasoning.hypothesis import CausalHypothesis
from ..reasoning.topology import Topology

if TYPE_CHECKING:
    from ..distributed.merge import JobDiagnosis

MAX_EDGES = 400
MAX_CHARS = 45_000

_CLASSES = (
    "  classDef root fill:#ffd6d6,stroke:#c0392b,stroke-width:3px,color:#000",
    "  classDef critical fill:#ffe0b3,stroke:#d35400,color:#000",
    "  classDef effect fill:#fff5cc,stroke:#b7950b,color:#000",
    "  classDef evidence fill:#eeeeee,stroke:#7f8c8d,color:#000",
    "  classDef healthy fill:#d5f5e3,stroke:#1e8449,color:#000",
)


_PERCENT_RUN = re.compile(r"%(?=%)|(?<=%)%")  # every % that touches another: what a directive needs


def escape(text: str) -> str:
    """Make text safe inside a quoted Mermaid label (or edge label): no parse error, no directive."""
    text = text.replace("#", "#35;")
    for raw, entity in (('"', "#quot;"), ("<", "#lt;"), (">", "#gt;"), ("`", "#96;")):
        text = text.replace(raw, entity)
    text = _PERCENT_RUN.sub("#37;", text)
    return text.replace("\r\n", "\n").replace("\n", "<br>")


def _label(*lines: str) -> str:
    return '["' + "<br>".join(escape(line) for line in lines if line) + '"]'


def _steps(e: SemanticEvent) -> str:
    return f"step {e.step_start}" if e.step_start == e.step_end else f"steps {e.step_start}-{e.step_end}"


def state_text(e: SemanticEvent) -> str:
    """A few words with the key number: 'dead: 100% of 64 units'."""
    m = e.metrics
    if e.kind is FailureKind.DEAD_NEURONS:
        return f"dead: {pct(m.get('dead_fraction', 0.0))} of {int(m.get('units', 0))} units"
    if e.kind is FailureKind.SATURATED_ACTIVATIONS:
        return f"saturated: {pct(m.get('saturated_fraction', 0.0))} of outputs"
    if e.kind is FailureKind.VANISHING_GRADIENTS:
        return "zero gradient" if m.get("exact_zero") else f"vanishing gradient: {num(m.get('grad_norm', 0.0))}"
    if e.kind is FailureKind.EXPLODING_GRADIENTS:
        return f"exploding gradient: {num(m.get('grad_norm', 0.0))}"
    if e.kind is FailureKind.NON_FINITE:
        return {
            EventType.INPUT: "non-finite input batch",
            EventType.LOSS: "non-finite loss",
            EventType.GRADIENT: "non-finite gradient",
        }.get(e.event_type, "non-finite output")
    if e.kind is FailureKind.FROZEN_PARAMETERS:
        return "frozen: never updated"
    if e.kind is FailureKind.STALLED_UPDATES:
        return f"stalled: update ratio {num(m.get('median_update_ratio', 0.0))}"
    if e.to_state == "anomalous":
        return f"outputs blow up: rms {num(m.get('output_rms', 0.0))}"
    return words.state(e)  # run-level findings, update surges, amplifying layers: the explanations' words


def _where(e: SemanticEvent, topo: Topology) -> str:
    if e.param:
        return f"'{e.param}'"
    if not e.layer:
        return {
            EventType.INPUT: "input",
            EventType.LOSS: "loss",
            EventType.RUN: "the run",
            EventType.UPDATE: "the model's updates",
        }.get(e.event_type, "model")
    return topo.describe(e.layer)


def _node_class(e: SemanticEvent, is_root: bool) -> str:
    if is_root:
        return "root"
    if e.kind is None:
        return "evidence"
    if e.kind in (FailureKind.NON_FINITE, FailureKind.EXPLODING_GRADIENTS):
        return "critical"
    return "effect"


def causal_graph(hypotheses: Sequence[CausalHypothesis], topo: Topology) -> str:
    """The flowchart source. Summarises (fewer nodes, then fewer hypotheses) until under the size limits."""
    if not hypotheses:
        return "\n".join(["flowchart TD", *_CLASSES, '  n0["No training failure detected"]', "  class n0 healthy"])
    for per_chain, max_hyp in ((40, 12), (12, 12), (6, 6), (3, 3), (1, 1)):
        text, edges = _render(hypotheses, topo, per_chain, max_hyp)
        if edges <= MAX_EDGES and len(text) <= MAX_CHARS:
            return text
    return text


def _render(hypotheses: Sequence[CausalHypothesis], topo: Topology, per_chain: int, max_hyp: int) -> tuple[str, int]:
    lines = ["flowchart TD", *_CLASSES]
    counter = 0
    edge_count = 0
    classes: dict[str, list[str]] = {}
    for rank, h in enumerate(hypotheses[:max_hyp], start=1):
        title = f"{rank}. {h.kind.value} (confidence {h.confidence:.2f})"
        lines.append(f"  subgraph h{rank}{_label(title)}")
        lines.append("    direction TB")
        node_of: dict[int, str] = {}
        groups = _groups(h, per_chain)
        for members in groups:
            node = f"n{counter}"
            counter += 1
            first = members[0]
            for e in members:
                node_of[id(e)] = node
            if len(members) == 1:
                label = _label(_where(first, topo), state_text(first), _steps(first))
            else:
                names = [m.param or m.layer for m in sorted(members, key=topo.event_position)]
                span = f"'{names[0]}' … '{names[-1]}'"
                start = min(m.step_start for m in members)
                label = _label(f"{len(members)} layers: {span}", state_text(first).split(":")[0], f"from step {start}")
            lines.append(f"    {node}{label}")
            classes.setdefault(_node_class(first, first is h.root), []).append(node)
        lines.append("  end")
        seen: set[tuple[str, str]] = set()
        for c in h.couplings:
            a, b = node_of.get(id(c.cause)), node_of.get(id(c.effect))
            if a is None or b is None or a == b or (a, b) in seen:
                continue
            seen.add((a, b))
            lines.append(f'  {a} -->|"{escape(c.relation)}"| {b}')
            edge_count += 1
    hidden = len(hypotheses) - max_hyp
    if hidden > 0:
        lines.append(f"  n{counter}{_label(f'… {hidden} more hypotheses (see the text report)')}")
        classes.setdefault("evidence", []).append(f"n{counter}")
    for name, nodes in classes.items():
        lines.append(f"  class {','.join(nodes)} {name}")
    return "\n".join(lines), edge_count


def _groups(h: CausalHypothesis, per_chain: int) -> list[list[SemanticEvent]]:
    """The root alone, then effects: one node each, or one node per state when the chain is long."""
    effects = h.chain[1:]
    if len(effects) <= per_chain:
        return [[h.root], *[[e] for e in effects]]
    buckets: dict[tuple[str, str], list[SemanticEvent]] = {}
    for e in effects:
        buckets.setdefault((e.event_type.value, e.to_state), []).append(e)
    return [[h.root], *buckets.values()]


#: Faults drawn in a job graph; the rest are counted in one node.
MAX_JOB_FINDINGS = 24


def job_graph(job: JobDiagnosis) -> str:
    from ..distributed.merge import rank_list

    """A flowchart of a distributed job: each group of ranks points at the faults it shows; ranks that sent
    nothing are dashed nodes, ranks without a fault one green node."""
    lines = [
        "flowchart LR",
        *_CLASSES,
        "  classDef missing fill:#ffffff,stroke:#7f8c8d,stroke-dasharray:5 5,color:#000",
    ]
    classes: dict[str, list[str]] = {}
    group_node: dict[tuple[int, ...], str] = {}
    counter = 0

    def node(label: str, css: str) -> str:
        nonlocal counter
        name = f"n{counter}"
        counter += 1
        lines.append(f"  {name}{label}")
        classes.setdefault(css, []).append(name)
        return name

    def ranks_label(ranks: tuple[int, ...]) -> str:
        if len(ranks) == job.world_size and job.world_size > 1:
            return "both ranks" if job.world_size == 2 else f"all {job.world_size} ranks"
        return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}"

    edges: list[str] = []
    for f in job.findings[:MAX_JOB_FINDINGS]:
        if f.ranks not in group_node:
            group_node[f.ranks] = node(_label(ranks_label(f.ranks)), "evidence")
        css = "critical" if f.kind in (FailureKind.NON_FINITE, FailureKind.EXPLODING_GRADIENTS) else "root"
        shard = "a data shard problem" if f.data_shard else ""
        target = node(_label(f.kind.value, f.where(), shard), css)
        edges.append(f'  {group_node[f.ranks]} -->|"{escape(f.onset())}"| {target}')
    hidden = len(job.findings) - MAX_JOB_FINDINGS
    if hidden > 0:
        node(_label(f"… {hidden} more faults (see the text report)"), "evidence")
    faulty = {r for f in job.findings for r in f.ranks}
    clean = tuple(sorted(r for r in job.reported if r not in faulty))
    if clean:
        node(_label(ranks_label(clean), "no failure"), "healthy")
    for rank, why in sorted(job.missing.items())[:MAX_JOB_FINDINGS]:
        node(_label(f"rank {rank}", why, "findings unknown"), "missing")
    if len(job.missing) > MAX_JOB_FINDINGS:
        node(_label(f"… {len(job.missing) - MAX_JOB_FINDINGS} more ranks sent nothing"), "missing")
    lines.extend(edges)
    for name, nodes in classes.items():
        lines.append(f"  class {','.join(nodes)} {name}")
    return "\n".join(lines)
