"""Causal graphs fit GitHub's 980-pixel column with readable text whatever the model's width: checked by rendering
them with real Mermaid and measuring the drawing."""

from __future__ import annotations

import re

import pytest

from neuraldbg import EventType, FailureKind, SemanticEvent
from neuraldbg.demo import DEMOS
from neuraldbg.export.mermaid import MAX_CHILDREN, causal_graph
from neuraldbg.reasoning import CausalHypothesis, Coupling, Topology, builtin_rules, diagnose

mermaidx = pytest.importorskip("mermaidx")

COLUMN = 980  # pixels: GitHub's Markdown column


def drawn(source: str) -> tuple[float, int]:
    """The rendered width in pixels and the number of nodes."""
    svg = mermaidx.render(source).svg()
    box = re.search(r'viewBox="[-\d.]+ [-\d.]+ ([\d.]+) [\d.]+"', svg)
    assert box is not None, svg[:300]
    return float(box.group(1)), len(re.findall(r'<g class="node ', svg))


def wide_dead_model(width: int) -> tuple[list[SemanticEvent], Topology]:
    """A dead ReLU at the end of ``width`` Linear layers, each of which then gets a zero gradient."""
    names = [n for i in range(width) for n in (f"fc{i + 1}", f"act{i + 1}")]
    topo = Topology(
        order=names,
        types={n: "Linear" if n.startswith("fc") else "ReLU" for n in names},
        roles={n: "parametric" if n.startswith("fc") else "gated" for n in names},
    )
    dead = SemanticEvent(EventType.ACTIVATION, FailureKind.DEAD_NEURONS, names[-1], None, 0, 49, None, "dead",
                         {"dead_fraction": 1.0, "units": 64.0}, 0.9)  # fmt: skip
    zero = [
        SemanticEvent(
            EventType.GRADIENT,
            FailureKind.VANISHING_GRADIENTS,
            n,
            None,
            0,
            49,
            None,
            "vanishing",
            {"grad_norm": 0.0, "exact_zero": 1.0},
            0.9,
        )
        for n in names[::2]
    ]
    return [dead, *zero], topo


@pytest.mark.parametrize("width", [3, 12, 60])
def test_the_victims_of_one_cause_are_one_node_and_the_graph_fits_the_column(width: int) -> None:
    events, topo = wide_dead_model(width)
    graph = causal_graph(diagnose(events, topo, builtin_rules()), topo)
    if width >= 3:
        assert f"zero gradient in {width} layers:<br>'fc1' … 'fc{width}'" in graph
    pixels, nodes = drawn(graph)
    assert pixels <= COLUMN and nodes == 2


def test_many_kinds_of_effects_are_capped_per_rank_and_what_was_folded_is_said() -> None:
    """A root whose effects fall in eight different states: at most MAX_CHILDREN nodes under it."""
    names = [f"layer{i}" for i in range(40)]
    topo = Topology(order=names, types=dict.fromkeys(names, "Linear"), roles=dict.fromkeys(names, "parametric"))
    root = SemanticEvent(EventType.GRADIENT, FailureKind.EXPLODING_GRADIENTS, names[0], None, 3, 9, None, "exploding",
                         {"grad_norm": 1e12}, 0.9)  # fmt: skip
    effects = [
        SemanticEvent(
            EventType.GRADIENT if i % 2 else EventType.ACTIVATION,
            None,
            name,
            None,
            4,
            9,
            None,
            f"state{i % 8}",
            {"value": 1.0},
            0.9,
        )
        for i, name in enumerate(names[1:])
    ]
    h = CausalHypothesis(FailureKind.EXPLODING_GRADIENTS, 0.9, root, [root, *effects], "x", "y",
                         [Coupling(root, e, f"relation {i % 3}") for i, e in enumerate(effects)])  # fmt: skip
    graph = causal_graph([h], topo)
    assert "more effects in" in graph and "(see the text report)" in graph
    pixels, nodes = drawn(graph)
    assert pixels <= COLUMN and nodes <= 1 + MAX_CHILDREN


def test_several_hypotheses_are_stacked_not_side_by_side() -> None:
    hypotheses = []
    for i in range(4):
        events, topo = wide_dead_model(5)
        events = [SemanticEvent(e.event_type, e.kind, f"m{i}.{e.layer}", e.param, e.step_start, e.step_end,
                                e.from_state, e.to_state, e.metrics, e.confidence) for e in events]  # fmt: skip
        hypotheses += diagnose(events, Topology(order=[f"m{i}.{n}" for n in topo.order],
                               types={f"m{i}.{k}": v for k, v in topo.types.items()},
                               roles={f"m{i}.{k}": v for k, v in topo.roles.items()}), builtin_rules())  # fmt: skip
    pixels, _ = drawn(causal_graph(hypotheses, Topology(order=[], types={}, roles={})))
    assert pixels <= COLUMN


@pytest.mark.parametrize("demo", ["learning-rate", "bad-batch", "dead", "saturated", "frozen"])
def test_the_demo_graphs_are_readable_at_980_pixels(demo: str) -> None:
    pixels, nodes = drawn(DEMOS[demo].run().export_mermaid_causal_graph())
    assert pixels <= COLUMN and nodes <= 1 + 2 * MAX_CHILDREN + 1


def test_parts_of_one_fault_without_a_causal_link_are_joined_by_a_line_not_an_arrow() -> None:
    """A frozen weight and its frozen bias: one fault, neither causes the other, so no arrow between them."""
    topo = Topology(order=["fc2"], types={"fc2": "Linear"}, roles={"fc2": "parametric"})
    frozen = FailureKind.FROZEN_PARAMETERS
    weight, bias = (
        SemanticEvent(EventType.UPDATE, frozen, "fc2", f"fc2.{p}", 0, 39, None, "frozen", {"update_ratio": 0.0}, 0.9)
        for p in ("weight", "bias")
    )
    h = CausalHypothesis(FailureKind.FROZEN_PARAMETERS, 0.9, weight, [weight, bias], "x", "y", [])
    graph = causal_graph([h], topo)
    assert "-->" not in graph and "  n0 -.- n1" in graph.splitlines()
    pixels, nodes = drawn(graph)
    assert pixels <= COLUMN and nodes == 2
