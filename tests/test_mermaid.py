"""Mermaid causal graphs: golden strings, any layer name, size limits, and validation through real Mermaid."""

from __future__ import annotations

import re

import pytest

from neuraldbg import EventType, FailureKind, SemanticEvent
from neuraldbg.export.mermaid import MAX_CHARS, MAX_EDGES, causal_graph, escape
from neuraldbg.reasoning import Topology, builtin_rules, diagnose


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


NASTY = ['enc["x"]', "blocks.<0>", "layer#3;", "ünïcödé→β", "end", "a|b (c) {d}", "%%x", "back\\slash", "`tick`"]


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
    assert "ünïcödé→β" in svg
    assert "Parse error" not in svg


def test_the_golden_and_the_summarised_graphs_render_in_real_mermaid():
    mermaidx = pytest.importorskip("mermaidx")
    mermaidx.render(GOLDEN).svg()
    names = [f"layers.{i}" for i in range(600)]
    events, topo = dead_chain(names, dead_at=599)
    mermaidx.render(causal_graph(diagnose(events, topo, builtin_rules()), topo)).svg()
