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

from ..events import SemanticEvent
from ..kinds import registry
from ..reasoning.hypothesis import CausalHypothesis
from ..reasoning.topology import Topology
from ..text import cut, span
from .inert import inert

MAX_EDGES = 400
MAX_CHARS = 45_000

CLASSES = (
    "  classDef root fill:#ffd6d6,stroke:#c0392b,stroke-width:3px,color:#000",
    "  classDef critical fill:#ffe0b3,stroke:#d35400,color:#000",
    "  classDef effect fill:#fff5cc,stroke:#b7950b,color:#000",
    "  classDef evidence fill:#eeeeee,stroke:#7f8c8d,color:#000",
    "  classDef healthy fill:#d5f5e3,stroke:#1e8449,color:#000",
)


_PERCENT_RUN = re.compile(r"%(?=%)|(?<=%)%")  # every % that touches another: what a directive needs


#: Longest line of a label, in characters: a name longer than this is cut (Mermaid refuses a graph past its text
#: limit, and no reader follows a 30,000-character name in a box).
MAX_LABEL_LINE = 80


def escape(text: str) -> str:
    """Make text safe inside a quoted Mermaid label (or edge label): no parse error, no directive, no control or
    bidirectional character (written as visible escapes, see :mod:`neuraldbg.export.inert`)."""
    lines = text.replace("\r\n", "\n").split("\n")
    text = "\n".join(inert(line) for line in lines)
    text = text.replace("#", "#35;")
    for raw, entity in (('"', "#quot;"), ("<", "#lt;"), (">", "#gt;"), ("`", "#96;")):
        text = text.replace(raw, entity)
    text = _PERCENT_RUN.sub("#37;", text)
    return text.replace("\n", "<br>")


def label(*lines: str) -> str:
    """A quoted node label of escaped lines, each cut to :data:`MAX_LABEL_LINE` characters (the one way every graph
    of NeuralDBG writes a label)."""
    return '["' + "<br>".join(escape(cut(line, MAX_LABEL_LINE)) for line in lines if line) + '"]'


def _where(e: SemanticEvent, topo: Topology) -> str:
    """The layer with its type (``'3' (ReLU)``); for the model as a whole, what was observed there."""
    return topo.describe(e.layer) if e.layer and e.param is None else registry.place(e)


def node_class(e: SemanticEvent, is_root: bool) -> str:
    """How a node is drawn: the root, an acute failure (values blowing up), another failure, or evidence."""
    if is_root:
        return "root"
    room = registry.room_of(e)
    if e.kind is None or room is None:
        return "evidence"
    return "critical" if room.acute else "effect"


def causal_graph(hypotheses: Sequence[CausalHypothesis], topo: Topology) -> str:
    """The flowchart source. Summarises (fewer nodes, then fewer hypotheses) until under the size limits."""
    if not hypotheses:
        return "\n".join(["flowchart TD", *CLASSES, '  n0["No training failure detected"]', "  class n0 healthy"])
    for per_chain, max_hyp in ((40, 12), (12, 12), (6, 6), (3, 3), (1, 1)):
        text, edges = _render(hypotheses, topo, per_chain, max_hyp)
        if edges <= MAX_EDGES and len(text) <= MAX_CHARS:
            return text
    return text


def _render(hypotheses: Sequence[CausalHypothesis], topo: Topology, per_chain: int, max_hyp: int) -> tuple[str, int]:
    lines = ["flowchart TD", *CLASSES]
    counter = 0
    edge_count = 0
    classes: dict[str, list[str]] = {}
    for rank, h in enumerate(hypotheses[:max_hyp], start=1):
        title = f"{rank}. {h.kind.value} (confidence {h.confidence:.2f})"
        lines.append(f"  subgraph h{rank}{label(title)}")
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
                text = label(_where(first, topo), registry.label(first), span(first.step_start, first.step_end))
            else:
                names = [m.param or m.layer for m in sorted(members, key=topo.event_position)]
                names_span = f"'{names[0]}' … '{names[-1]}'"
                start = min(m.step_start for m in members)
                text = label(
                    f"{len(members)} layers: {names_span}", registry.label(first).split(":")[0], f"from step {start}"
                )
            lines.append(f"    {node}{text}")
            classes.setdefault(node_class(first, first is h.root), []).append(node)
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
        lines.append(f"  n{counter}{label(f'… {hidden} more hypotheses (see the text report)')}")
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
