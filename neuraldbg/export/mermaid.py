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

import itertools
import re
import textwrap
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


#: Children drawn under one node: more groups of effects are folded into one node that says what it holds. With
#: labels wrapped at :data:`WRAP` characters, three children side by side fit GitHub's 980-pixel column.
MAX_CHILDREN = 3
#: Effects of one cause, in one state, through one relation, drawn as one node from this many on.
GROUP_FROM = 3
#: Characters per line of a label (longer lines are wrapped, at most :data:`WRAP_LINES` lines per text).
WRAP = 36
WRAP_LINES = 3


def causal_graph(hypotheses: Sequence[CausalHypothesis], topo: Topology) -> str:
    """The flowchart source, top-down and narrow whatever the model's width: the effects of one cause in one state
    are one node (``zero gradient in 12 layers: 'fc1' … 'fc12'``), at most :data:`MAX_CHILDREN` nodes per rank
    (the rest folded into a node that says what it holds), labels wrapped, hypotheses stacked one under the other.
    Fewer hypotheses are drawn until the graph is under Mermaid's size limits."""
    if not hypotheses:
        return "\n".join(["flowchart TD", *CLASSES, '  n0["No training failure detected"]', "  class n0 healthy"])
    for max_hyp in (12, 6, 3, 1):
        text, edges = _render(hypotheses, topo, max_hyp)
        if edges <= MAX_EDGES and len(text) <= MAX_CHARS:
            return text
    return text


def wrapped(*lines: str) -> str:
    """A node label of :func:`label`'s kind whose texts are wrapped at :data:`WRAP` characters, each at most
    :data:`WRAP_LINES` lines (the last cut with an ellipsis).

    Each text is made :func:`inert` before it is wrapped: ``textwrap`` turns a newline, tab or carriage return
    into a space, so ``'a\\nb'`` would be drawn as ``'a b'``, another layer's name; escaped first, it reads
    ``'a\\x0ab'`` here as everywhere else."""
    out: list[str] = []
    for line in map(inert, lines):
        if not line:
            continue
        parts = textwrap.wrap(line, WRAP, break_long_words=True, break_on_hyphens=False) or [line]
        if len(parts) > WRAP_LINES:
            parts = [*parts[: WRAP_LINES - 1], cut(" ".join(parts[WRAP_LINES - 1 :]), WRAP)]
        out += parts
    return label(*out)


class _Group:
    """Events drawn as one node: the effects of one cause in one state through one relation (or one event)."""

    def __init__(self, parent: _Group | None, relation: str, members: list[SemanticEvent] | None = None) -> None:
        self.parent = parent
        self.relation = relation
        self.members: list[SemanticEvent] = members or []
        self.children: list[_Group] = []
        self.folded: list[_Group] = []  # for a node that stands for groups folded under one parent


def _tree(h: CausalHypothesis) -> tuple[_Group, list[_Group]]:
    """The hypothesis as a tree of groups under its root, and the evidence groups that set the root off."""
    root = _Group(None, "", [h.root])
    group_of: dict[int, _Group] = {id(h.root): root}
    cause_of = {id(c.effect): c for c in h.couplings}
    above = []
    for link in h.couplings:  # evidence that set the root off: drawn above it, alone
        if link.effect is h.root and id(link.cause) not in group_of:
            group_of[id(link.cause)] = _Group(None, link.relation, [link.cause])
            above.append(group_of[id(link.cause)])
    pending = [e for e in h.chain if id(e) not in group_of]
    while pending:  # in causal order: a cause gets its group before its effects
        placed = [e for e in pending if id(e) in cause_of and id(cause_of[id(e)].cause) in group_of]
        batch = placed or pending  # events whose cause is not drawn hang from the root
        buckets: dict[tuple[int, str, str, str], _Group] = {}
        for e in batch:
            cause = cause_of.get(id(e))
            parent = group_of.get(id(cause.cause)) if cause is not None else None
            relation = cause.relation if cause is not None and parent is not None else ""
            parent = parent or root
            key = (id(parent), relation, e.event_type.value, str(e.to_state))
            if key not in buckets:
                buckets[key] = _Group(parent, relation)
            buckets[key].members.append(e)
        for bucket in buckets.values():
            parts = (
                [bucket]
                if len(bucket.members) >= GROUP_FROM
                else [_Group(bucket.parent, bucket.relation, [e]) for e in bucket.members]
            )  # one or two: each its own node, with its own numbers
            for part in parts:
                assert part.parent is not None
                part.parent.children.append(part)
                for e in part.members:
                    group_of[id(e)] = part
        taken = {id(e) for e in batch}
        pending = [e for e in pending if id(e) not in taken]
    _fold(root)
    return root, above


def _fold(root: _Group) -> None:
    """At most :data:`MAX_CHILDREN` nodes in each rank of the drawing (the root's children, their children, ...):
    the rest of a rank become one node under the first of their parents, which takes their children and says what
    it holds."""
    rank = list(root.children)
    while rank:
        if len(rank) > MAX_CHILDREN:
            kept, rest = rank[: MAX_CHILDREN - 1], rank[MAX_CHILDREN - 1 :]
            fold = _Group(rest[0].parent, "", [e for g in rest for e in g.members])
            fold.folded = rest
            fold.children = [child for g in rest for child in g.children]
            for child in fold.children:
                child.parent = fold
            for g in rest:
                assert g.parent is not None
                g.parent.children.remove(g)
            assert fold.parent is not None
            fold.parent.children.append(fold)
            rank = [*kept, fold]
        rank = [child for g in rank for child in g.children]


class Nodes:
    """The nodes of a flowchart being written: ids ``n0 … nN`` in order, each line appended to ``lines``, and the
    class of each node for the ``class`` lines at the end (every graph of NeuralDBG names its nodes this way)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.classes: dict[str, list[str]] = {}

    def add(self, text: str, css: str, indent: str = "    ") -> str:
        node = f"n{sum(len(nodes) for nodes in self.classes.values())}"
        self.lines.append(f"{indent}{node}{text}")
        self.classes.setdefault(css, []).append(node)
        return node

    def class_lines(self) -> list[str]:
        return [f"  class {','.join(nodes)} {name}" for name, nodes in self.classes.items()]


def _render(hypotheses: Sequence[CausalHypothesis], topo: Topology, max_hyp: int) -> tuple[str, int]:
    lines = ["flowchart TD", *CLASSES]
    nodes = Nodes(lines)
    add = nodes.add
    edges: list[str] = []
    tops: list[str] = []

    for rank, h in enumerate(hypotheses[:max_hyp], start=1):
        title = f"{rank}. {h.kind.value} (confidence {h.confidence:.2f})"
        lines.append(f"  subgraph h{rank}{label(title)}")
        lines.append("    direction TB")
        tops.append(f"h{rank}")
        root, above = _tree(h)
        root_node = add(_one(h.root, topo), node_class(h.root, True))
        for group in above:
            edges.append(_edge(add(_one(group.members[0], topo), node_class(group.members[0], False)), root_node,
                               group.relation))  # fmt: skip
        queue = [(root_node, child) for child in root.children]
        while queue:  # breadth first: each rank of the drawing in turn
            parent_node, group = queue.pop(0)
            if group.folded:
                node = add(_folded_label(group.folded), "evidence")
            else:
                node = add(_group_label(group.members, topo), node_class(group.members[0], False))
            if group.relation or group.folded:
                edges.append(_edge(parent_node, node, group.relation))
            else:  # part of the same fault with no causal link (the bias of a frozen weight): a plain line, no arrow
                edges.append(f"  {parent_node} -.- {node}")
            queue += [(node, child) for child in group.children]
        lines.append("  end")
    hidden = len(hypotheses) - max_hyp
    if hidden > 0:
        tops.append(add(label(f"… {hidden} more hypotheses (see the text report)"), "evidence", "  "))
    lines += edges
    lines += [f"  {a} ~~~ {b}" for a, b in itertools.pairwise(tops)]  # hypotheses one under the other
    lines += nodes.class_lines()
    return "\n".join(lines), len(edges)


def _edge(cause: str, effect: str, relation: str) -> str:
    return f'  {cause} -->|"{escape(relation)}"| {effect}' if relation else f"  {cause} --> {effect}"


def _one(e: SemanticEvent, topo: Topology) -> str:
    return wrapped(_where(e, topo), registry.label(e), span(e.step_start, e.step_end))


def _group_label(members: list[SemanticEvent], topo: Topology) -> str:
    first = members[0]
    if len(members) == 1:
        return _one(first, topo)
    names = [m.param or m.layer for m in sorted(members, key=topo.event_position)]
    what = registry.label(first).split(":")[0]
    start, end = min(m.step_start for m in members), max(m.step_end for m in members)
    return wrapped(f"{what} in {len(members)} layers:", f"'{names[0]}' … '{names[-1]}'", span(start, end))


def _folded_label(groups: list[_Group]) -> str:
    members = [e for group in groups for e in group.members]
    kinds = list(dict.fromkeys(registry.label(g.members[0]).split(":")[0] for g in groups))
    shown = ", ".join(kinds[:3]) + (f" and {len(kinds) - 3} more" if len(kinds) > 3 else "")
    places = len({m.param or m.layer for m in members})
    return wrapped(f"… and {len(members)} more effects in {places} layers", shown, "(see the text report)")
