"""summary.md as GitHub shows it: hostile names stay text, every failing row is explained, charts tell the truth."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_neuraldbg import markdown
from pytest_neuraldbg.outcomes import Outcomes

cmarkgfm = pytest.importorskip("cmarkgfm")


def render(text: str) -> str:
    """GitHub-flavoured Markdown to HTML, raw HTML let through (GitHub sanitises after this; the test wants none)."""
    from cmarkgfm.cmark import Options

    return str(cmarkgfm.github_flavored_markdown_to_html(text, options=Options.CMARK_OPT_UNSAFE))


def hypothesis(layer: str) -> dict[str, Any]:
    return {
        "kind": "dead_neurons",
        "confidence": 1.0,
        "summary": f"dead_neurons at '{layer}' from step 0 (confidence 1.00)",
        "explanation": f"Dead neurons in '{layer}' (ReLU): 100% of 16 units inactive.",
        "suggestion": "",
        "layer": layer,
        "step": 0,
        "chain": [],
    }


def record(nodeid: str, verdict: str = "unhealthy", layer: str = "3", **extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "nodeid": nodeid,
        "run": "1",
        "verdict": verdict,
        "steps": 30,
        "hypotheses": [hypothesis(layer)] if verdict == "unhealthy" else [],
        "mermaid": 'flowchart TD\n  n0["x"]',
        "kinds": [],
    }
    rec.update(extra)
    return rec


def outcomes(**tests: str) -> Outcomes:
    found = Outcomes()
    for name, outcome in tests.items():
        report = SimpleNamespace(
            nodeid=f"t.py::{name}",
            when="call",
            outcome=outcome,
            passed=outcome == "passed",
            failed=outcome == "failed",
            skipped=False,
            longrepr=SimpleNamespace(
                reprcrash=SimpleNamespace(
                    message=f"AssertionError: NeuralDBG: the loss did not fall by 2x over 30 steps ({name})",
                    path="t.py",
                    lineno=7,
                )
            ),
        )
        found.add(report)
    return found


HOSTILE = [
    "a|<img src=x onerror=alert(1)>|b",
    "[click](javascript:alert(1))",
    "`x` | <script>alert(1)</script>",
    "\x1b[1A\x1b[2Kall healthy",
    "\u202egnp.exe",
    "&lt;img src=x onerror=alert(1)&gt; &#x202E;",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_test_id_or_layer_name_renders_as_text(name: str) -> None:
    recs = [record(f"tests/test_x.py::test_it[{name}]", layer=name), record("t.py::test_ok", "healthy")]
    text = markdown.summary(recs, outcomes=outcomes(test_ok="passed"))
    html = render(text)
    assert "<img" not in html and "<script" not in html and "javascript:" not in html.replace("javascript:alert", "")
    assert 'href="javascript' not in html
    assert "\x1b" not in text and "\u202e" not in text and "\u202e" not in html
    table = html.split("<table>")[1].split("</table>")[0]
    for row in re.findall(r"<tr>(.*?)</tr>", table, re.S):
        assert row.count("<td") in (0, 7), row  # a "|" never adds a cell
    assert html.count("<td") == 14


def test_a_lone_surrogate_or_control_character_in_a_name_is_shown_escaped() -> None:
    text = markdown.summary([record("t.py::test_x", layer="fc\udc80\x07")])
    text.encode("utf-8")  # never raises
    assert "fc\\udc80\\x07" in text


def test_every_failing_row_has_a_section_even_when_its_run_is_healthy() -> None:
    recs = [record("t.py::test_learns", "healthy"), record("t.py::test_dead")]
    text = markdown.summary(recs, outcomes=outcomes(test_learns="failed", test_dead="failed"))
    assert "### ❌ `t.py::test_learns`: test failed (its run was healthy)" in text
    assert "NeuralDBG: the loss did not fall by 2x over 30 steps (test_learns)" in text
    assert "(t.py:7)" in text
    assert "### ❌ `t.py::test_dead`" in text
    html = render(text)
    rows = [r for r in re.findall(r"<tr>(.*?)</tr>", html, re.S) if "<td" in r]
    failing = [r for r in rows if "<strong>failed</strong>" in r]
    assert len(failing) == 2


def test_healthy_runs_show_their_key_numbers_in_one_line() -> None:
    numbers = {"final_loss": 0.0123, "grad_step": 29, "grad_min": ["0", 3e-4], "grad_max": ["4", 1.25]}
    text = markdown.summary([record("t.py::test_ok", "healthy", numbers=numbers)])
    assert (
        "- ✅ `t.py::test_ok`: 30 steps, final loss 0.0123, gradient norm at step 29 from 3.0e-4 (`0`) to 1.25 (`4`)"
        in text.splitlines()
    )


def test_the_table_stays_narrow_whatever_the_explanation() -> None:
    long = dict(hypothesis("3"), summary="x" * 500, explanation="y" * 2000)
    text = markdown.summary([record("t.py::test_dead", hypotheses=[long, long])])
    row = next(line for line in text.splitlines() if line.startswith("| `t.py"))
    assert len(row) < 120 and "dead\\_neurons +1" in row


def test_a_session_stopped_early_says_so() -> None:
    text = markdown.summary([record("t.py::test_dead")], stopped="stopping after 1 failures")
    assert "**The session stopped early (stopping after 1 failures): tests after it did not run.**" in text


def test_a_short_run_is_charted_over_every_step_and_a_partial_series_says_where_it_stops() -> None:
    series = [
        {"layer": "0", "label": "first layer '0'", "points": [[s, 1.0] for s in range(32)]},
        {"layer": "2", "label": "root '2'", "points": [[s, 0.1] for s in range(17)]},
    ]
    source, legend = markdown.xychart(series)
    assert '  x-axis "step" 0 --> 31' in source.splitlines()
    assert all(len(line.split(", ")) == 32 for line in source.splitlines() if line.startswith("  line"))
    assert "root '2' was recorded at steps 0-16 only" in legend
    assert markdown.valid_chart(source)


def test_the_axis_reaches_the_last_step_of_the_run_even_where_nothing_was_recorded() -> None:
    series = [{"layer": "0", "label": "a", "points": [[s, 1.0 + s] for s in range(17)]}]
    source, legend = markdown.xychart(series, last_step=31)
    assert '  x-axis "step" 0 --> 31' in source
    assert "a was recorded at steps 0-16 only" in legend


def test_steps_recorded_unevenly_are_placed_on_a_true_step_axis() -> None:
    series = [{"layer": "0", "label": "a", "points": [[22, 1.0], [23, 10.0], [32, 100.0]]}]
    source, _ = markdown.xychart(series)
    assert '  x-axis "step" 22 --> 32' in source
    values = re.search(r"line \[(.*)\]", source).group(1).split(", ")  # type: ignore[union-attr]
    assert values == ["0", "1", "1", "1", "1", "1", "2", "2", "2", "2", "2"]  # steps 22..32, each step's nearest


def test_two_series_that_would_hide_each_other_become_one_line_with_both_labels() -> None:
    points = [[s, 0.5] for s in range(10)]
    series = [
        {"layer": "0", "label": "first layer '0'", "points": points},
        {"layer": "3", "label": "x", "points": points},
    ]
    source, legend = markdown.xychart(series)
    assert sum(line.startswith("  line") for line in source.splitlines()) == 1
    assert "first layer '0' = x" in legend


@pytest.mark.parametrize(
    "points",
    [[[5, 1.0]], [[3, 1.0], [3, 2.0]], []],
)
def test_no_chart_is_emitted_without_two_steps(points: list[list[float]]) -> None:
    assert markdown.xychart([{"layer": "0", "label": "a", "points": points}]) == ("", "")


@pytest.mark.parametrize(
    "source",
    [
        'xychart-beta\n  x-axis "step" 5 --> 5\n  y-axis "y" 0 --> 1\n  line [0, 1]',
        'xychart-beta\n  x-axis "step" 0 --> 5\n  y-axis "y" 1 --> 1\n  line [1, 1]',
        'xychart-beta\n  x-axis "step" 0 --> 5\n  y-axis "y" 0 --> 1\n  line [0]',
        'xychart-beta\n  x-axis "step" 0 --> 5\n  y-axis "y" 0 --> 1\n  line [0, nan]',
        'xychart-beta\n  x-axis "step" [0, 1]\n  y-axis "y" 0 --> 1\n  line [0, 1]',
    ],
)
def test_invalid_charts_are_recognised(source: str) -> None:
    assert not markdown.valid_chart(source)


def test_the_new_charts_render_with_real_mermaid() -> None:
    mermaidx = pytest.importorskip("mermaidx")
    series = [
        {"layer": "0", "label": "a", "points": [[22, 1.0], [23, math.inf], [32, 0.0]]},
        {"layer": "1", "label": "b", "points": [[22, 1e-9], [40, 1e3]]},
    ]
    source, _ = markdown.xychart(series)
    assert markdown.valid_chart(source)
    assert "<svg" in mermaidx.render(source).svg()
