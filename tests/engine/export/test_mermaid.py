"""Mermaid causal graphs: golden strings, any layer name, size limits, and validation through real Mermaid."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from neuraldbg import EventType, FailureKind, SemanticEvent
from neuraldbg.export.mermaid import MAX_CHARS, MAX_EDGES, causal_graph, escape, wrapped
from neuraldbg.reasoning import CausalHypothesis, Coupling, Topology, builtin_rules, diagnose


def dead_chain(names: list[str], dead_at: int) -> tuple[list[SemanticEvent], Topology]:
    types = {n: ("ReLU" if i % 2 else "Linear") for i, n in enumerate(names)}
    roles = {n: ("gated" if i % 2 else "parametric") for i, n in enumerate(names)}
    topo = Topology(order=names, types=types, roles=roles)
    events = [
        SemanticEvent(
            EventType.ACTIVATION,
            FailureKind.DEAD_NEURONS,
            names[dead_at],
            None,
            0,
            49,
            None,
            "dead",
            {"dead_fraction": 1.0, "units": 64.0},
            0.9,
        )
    ]
    for i in range(0, dead_at, 2):
        events.append(
            SemanticEvent(
                EventType.GRADIENT,
                FailureKind.VANISHING_GRADIENTS,
                names[i],
                None,
                0,
                49,
                None,
                "vanishing",
                {"grad_norm": 0.0, "exact_zero": 1.0},
                0.9,
            )
        )
    return events, topo


GOLDEN = """flowchart TD
  classDef root fill:#ffd6d6,stroke:#c0392b,stroke-width:3px,color:#000
  classDef critical fill:#ffe0b3,stroke:#d35400,color:#000
  classDef effect fill:#fff5cc,stroke:#b7950b,color:#000
  classDef evidence fill:#eeeeee,stroke:#7f8c8d,color:#000
  classDef healthy fill:#d5f5e3,stroke:#1e8449,color:#000
  subgraph h1["1. dead_neurons (confidence 0.93)"]
    direction TB
    n0["'3' (ReLU)<br>dead: 100% of 64 units<br>steps 0-49"]
    n1["'0' (Linear)<br>zero gradient<br>steps 0-49"]
    n2["'2' (Linear)<br>zero gradient<br>steps 0-49"]
  end
  n0 -->|"zeroes the gradient of"| n1
  n0 -->|"zeroes the gradient of"| n2
  class n0 root
  class n1,n2 effect"""


def test_a_dead_layer_graph_matches_the_golden_string():
    events, topo = dead_chain(["0", "1", "2", "3", "4"], dead_at=3)
    assert causal_graph(diagnose(events, topo, builtin_rules()), topo) == GOLDEN


def test_a_healthy_run_is_one_green_node():
    assert causal_graph([], Topology(order=[], types={}, roles={})) == "\n".join(
        [*GOLDEN.splitlines()[:6], '  n0["No training failure detected"]', "  class n0 healthy"]
    )


def test_escaping_turns_every_dangerous_character_into_an_entity():
    assert escape('a"b<c>d#e`f\ng') == "a#quot;b#lt;c#gt;d#35;e#96;f<br>g"
    assert escape("#quot;") == "#35;quot;"  # '#' first, so user text never forms an entity


def test_escaping_breaks_every_run_of_percent_signs_so_no_directive_can_form():
    assert escape("%%{init: {}}%%") == "#37;#37;{init: {}}#37;#37;"
    assert escape("a%%%b") == "a#37;#37;#37;b"
    assert escape("100% of 64 units, 5%") == "100% of 64 units, 5%"  # a lone % stays readable


NASTY = [
    'enc["x"]',
    "blocks.<0>",
    "layer#3;",
    "ünïcödé→β",
    "end",
    "a|b (c) {d}",
    "%%x",
    "back\\slash",
    "`tick`",
    "a%%{b",
]


def test_any_layer_name_yields_only_safe_ids_and_quoted_labels():
    names = [n for name in NASTY for n in (name, name + ".act")]
    events, topo = dead_chain(names, dead_at=len(names) - 1)
    graph = causal_graph(diagnose(events, topo, builtin_rules()), topo)
    for line in graph.splitlines()[6:]:
        line = line.strip()
        assert re.fullmatch(
            r'(subgraph h\d+\[".*"\]|direction TB|end|n\d+\[".*"\]|n\d+ -->\|".*"\| n\d+|class [n\d,]+ \w+)', line
        ), line
        inside = re.findall(r'"(.*)"', line)
        assert all('"' not in s and "<" not in s.replace("<br>", "") for s in inside)
    assert "%%" not in graph


def root_label(name: str) -> str:
    """The label of the node drawn for a dead layer called ``name`` (the root of its graph)."""
    events, topo = dead_chain(["0", name, "2", "3"], dead_at=1)
    graph = causal_graph(diagnose(events, topo, builtin_rules()), topo)
    return next(line.strip() for line in graph.splitlines() if line.strip().startswith("n0["))


def test_a_newline_tab_or_carriage_return_in_a_layer_name_is_drawn_as_a_visible_escape():
    drawn = root_label("new\nline\tand\rcr")
    assert drawn == """n0["'new\\x0aline\\x09and\\x0dcr' (ReLU)<br>dead: 100% of 64 units<br>steps 0-49"]"""
    assert drawn != root_label("new line and cr")  # two layers, two names
    assert (
        wrapped("a long layer name\tthat wraps over two lines")
        == '["a long layer name\\x09that wraps over<br>two lines"]'
    )
    breakout = root_label('x\n"] --> n9["y\r%%{init: {}}%%\t<b>`z`</b>')  # still text, whatever follows a newline
    inside = breakout.removeprefix('n0["').removesuffix('"]')
    assert '"' not in inside and "<" not in inside.replace("<br>", "") and "%%" not in inside and "`" not in inside


def test_a_huge_chain_is_summarised_under_mermaids_limits():
    names = [f"encoder.layers.{i}.{part}" for i in range(400) for part in ("linear", "act")]
    events, topo = dead_chain(names, dead_at=len(names) - 1)
    hypotheses = diagnose(events, topo, builtin_rules())
    graph = causal_graph(hypotheses, topo)
    assert len(re.findall(r"-->", graph)) < MAX_EDGES
    assert len(graph) < MAX_CHARS
    assert "400 layers" in graph or "399 layers" in graph


def test_the_graph_renders_in_real_mermaid_for_any_layer_name():
    mermaidx = pytest.importorskip("mermaidx")
    names = [n for name in NASTY for n in (name, name + ".act")]
    events, topo = dead_chain(names, dead_at=len(names) - 1)
    graph = causal_graph(diagnose(events, topo, builtin_rules()), topo)
    svg = mermaidx.render(graph).svg()
    assert "Parse error" not in svg
    # victims of one cause are one node that names the first and the last; every name, as the root, is drawn
    for name in NASTY:
        events, topo = dead_chain(["in", name, "out", "act"], dead_at=3)
        events[0] = replace(events[0], layer=name)
        named = mermaidx.render(causal_graph(diagnose(events, topo, builtin_rules()), topo)).svg()
        assert "Parse error" not in named
    events, topo = dead_chain(["0", "ünïcödé→β"], dead_at=1)
    assert "ünïcödé→β" in mermaidx.render(causal_graph(diagnose(events, topo, builtin_rules()), topo)).svg()


def test_the_golden_and_the_summarised_graphs_render_in_real_mermaid():
    mermaidx = pytest.importorskip("mermaidx")
    mermaidx.render(GOLDEN).svg()
    names = [f"layers.{i}" for i in range(600)]
    events, topo = dead_chain(names, dead_at=599)
    mermaidx.render(causal_graph(diagnose(events, topo, builtin_rules()), topo)).svg()


#: Names that act on Mermaid when left as they are: a directive that restyles the graph, one that injects CSS
#: into the SVG, a directive left open (a parse error), a stray directive end, and class shorthand.
DIRECTIVES = [
    "%%{init: {'themeCSS': '.node rect{fill:#ff0000 !important}'}}%%",
    "%%{init: {'theme': 'dark', 'fontFamily': 'Comic Sans MS'}}%%",
    "a%%{b",
    "}%%",
    "x:::root",
]


def hostile_graph(names: list[str], relation: str) -> str:
    """A dead layer whose victims carry ``names``; the first coupling's relation is ``relation``."""
    chain_names = [n for name in names for n in (name, f"{name}.act")] + ["head", "act"]
    events, topo = dead_chain(chain_names, dead_at=len(chain_names) - 1)
    h = diagnose(events, topo, builtin_rules())[0]
    first = h.couplings[0]
    couplings = [Coupling(first.cause, first.effect, relation), *h.couplings[1:]]
    hyp = CausalHypothesis(h.kind, h.confidence, h.root, h.chain, h.explanation, h.suggestion, couplings)
    return causal_graph([hyp], topo)


def style_of(svg: str) -> str:
    found = re.search(r"<style>(.*?)</style>", svg, re.S)
    assert found is not None
    return found.group(1)


def test_a_mermaid_directive_in_a_layer_name_or_relation_neither_applies_nor_breaks_the_graph():
    mermaidx = pytest.importorskip("mermaidx")
    hostile = mermaidx.render(hostile_graph(DIRECTIVES, DIRECTIVES[0])).svg()
    tame = mermaidx.render(hostile_graph([f"layer{i}" for i in range(len(DIRECTIVES))], "kills")).svg()
    assert style_of(hostile) == style_of(tame)  # no theme, font or CSS came from the names
    assert "rgb(255, 0, 0)" not in hostile and "ff0000" not in style_of(hostile)
    for name in ("a%%{b", "}%%", "x:::root"):  # each name, drawn as the root, is shown as text, literally
        events, topo = dead_chain(["in", "x", "out", "act"], dead_at=3)
        events[0] = replace(events[0], layer=name)
        svg = mermaidx.render(causal_graph(diagnose(events, topo, builtin_rules()), topo)).svg()
        assert name in svg and style_of(svg) == style_of(tame)


def test_a_run_level_finding_is_drawn_in_words_as_a_node_of_the_run():
    import torch
    import torch.nn.functional as F
    from torch import nn

    from neuraldbg import NeuralDbg

    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))
    model.eval()  # trained in eval mode: dropout is off while the optimizer steps
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model) as dbg:
        for _ in range(5):
            opt.zero_grad()
            F.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1)).backward()
            opt.step()
    graph = dbg.export_mermaid_causal_graph()
    assert """["the run<br>trained in eval mode (5 steps: '1'<br>(Dropout))<br>steps 0-4"]""" in graph  # wrapped
    assert "exploding" not in graph and "model<br>" not in graph
