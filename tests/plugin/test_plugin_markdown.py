"""summary.md and its gradient chart, from hand-made run records."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest

from pytest_neuraldbg import markdown
from pytest_neuraldbg.outcomes import BaselineResult, Outcomes


def hypothesis(layer: str = "3", summary: str = "dead_neurons at '3' from step 0 (confidence 1.00)") -> dict:
    return {
        "kind": "dead_neurons",
        "confidence": 1.0,
        "summary": summary,
        "explanation": f"Dead neurons in '{layer}' (ReLU): 100% of 16 units inactive.",
        "suggestion": "",
        "layer": layer,
        "step": 0,
        "chain": [],
    }


def record(nodeid: str, verdict: str = "unhealthy", **extra: object) -> dict:
    rec = {
        "nodeid": nodeid,
        "run": "1",
        "verdict": verdict,
        "steps": 30,
        "hypotheses": [hypothesis()] if verdict == "unhealthy" else [],
        "mermaid": 'flowchart TD\n  n0["x"]',
        "grad_chart": [
            {"layer": "0", "label": "first layer '0'", "points": [[0, 0.0], [1, 0.0]]},
            {"layer": "4", "label": "last layer '4'", "points": [[0, 0.5], [1, 5.0]]},
        ],
    }
    rec.update(extra)
    return rec


def test_the_chart_plots_log10_norms_with_zero_at_the_floor_and_non_finite_at_the_ceiling() -> None:
    series = [
        {"label": "first layer '0'", "points": [[0, 0.0], [10, 0.0], [20, 0.0]]},
        {"label": "root '2'", "points": [[0, 1e-3], [10, 10.0], [20, "inf"]]},
    ]
    source, legend = markdown.xychart(series)
    assert source.splitlines()[1:] == [
        "xychart-beta",
        '  title "Gradient norm (log10) over training steps"',
        '  x-axis "step" 0 --> 20',  # a true step axis: every step of the run, evenly spaced
        '  y-axis "log10 gradient norm" -4 --> 2',
        "  line [" + ", ".join(["-4"] * 21) + "]",
        "  line [" + ", ".join(["-3"] * 6 + ["1"] * 10 + ["2"] * 5) + "]",  # each step's nearest recorded value
    ]
    assert source.startswith('%%{init: {"themeVariables": {"xyChart": {"plotColorPalette": "#1f77b4, #d62728"}}}}%%')
    assert legend == ("Lines: 🔵 first layer '0' · 🔴 root '2'. A zero gradient is drawn at -4, a non-finite one at 2.")


def test_the_chart_samples_long_runs_and_fills_missing_steps_with_the_nearest_value() -> None:
    series = [
        {"label": "a", "points": [[s, 10.0 ** (s % 3)] for s in range(200)]},
        {"label": "b", "points": [[0, 1.0], [199, 100.0]]},
    ]
    source, _ = markdown.xychart(series, max_points=40)
    assert '  x-axis "step" 0 --> 199' in source.splitlines()
    lines = [line for line in source.splitlines() if line.strip().startswith("line")]
    assert all(len(line.split(", ")) == 40 for line in lines)  # 40 evenly spaced steps over the whole run
    b = [float(v) for v in lines[1].split("[")[1].rstrip("]").split(", ")]
    assert b[:5] == [0, 0, 0, 0, 0] and b[-1] == 2  # nearest recorded point: step 0 at the start, 199 at the end


def test_an_empty_chart_renders_nothing() -> None:
    assert markdown.xychart([]) == ("", "")
    assert markdown.xychart([{"label": "a", "points": []}]) == ("", "")


def test_markdown_text_is_escaped_so_layer_names_are_not_formatting() -> None:
    assert markdown.escape("'__main__' <b> *x* | y") == "'\\_\\_main\\_\\_' \\<b\\> \\*x\\* \\| y"
    assert markdown.code("test_x.py::test[`a`\nb]") == "`test_x.py::test['a'\\x0ab]`"
    assert markdown.code("t.py::test[a|b]", table=True) == "`t.py::test[a\\|b]`"  # GitHub splits cells first


def outcomes(**tests: str) -> Outcomes:
    """pytest's outcomes of hand-made call reports: ``test_name=outcome`` (passed, failed, xfailed, ...)."""
    found = Outcomes()
    for name, outcome in tests.items():
        failed_setup = outcome == "error"
        report = SimpleNamespace(
            nodeid=f"t.py::{name}",
            when="setup" if failed_setup else "call",
            outcome={"xfailed": "skipped", "xpassed": "passed", "error": "failed"}.get(outcome, outcome),
            **({"wasxfail": ""} if outcome in ("xfailed", "xpassed") else {}),
        )
        report.passed, report.failed, report.skipped = (report.outcome == o for o in ("passed", "failed", "skipped"))
        found.add(report)
    return found


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| `")]


def test_the_summary_puts_unhealthy_runs_first_with_their_explanation_graph_and_chart() -> None:
    seen = outcomes(test_ok="passed", test_dead="passed")
    text = markdown.summary([record("t.py::test_ok", "healthy"), record("t.py::test_dead")], gate="warn", outcomes=seen)
    assert text.startswith(
        "## NeuralDBG training health\n\n**No test watching training failed, but 1 of 2 watched runs are unhealthy** "
        "(runs: 1 of 2 unhealthy; gate: warn).\n\npytest, whole session: 2 passed.\n\n| Test | Outcome |"
    )
    assert table_rows(text) == [  # narrow: the long text goes to the sections below
        "| `t.py::test_dead` | passed | ❌ unhealthy | dead\\_neurons | `3` | 0 | - |",
        "| `t.py::test_ok` | passed | ✅ healthy | - | - | - | - |",
    ]
    assert "### ❌ `t.py::test_dead`\n\n**dead\\_neurons at '3' from step 0 (confidence 1.00)**" in text
    assert "<details><summary>Causal graph</summary>\n\n```mermaid\nflowchart TD" in text
    assert text.count("```mermaid") == 2 and "xychart-beta" in text
    assert "### ❌ `t.py::test_ok`" not in text


def test_tests_that_failed_on_their_baseline_are_not_called_healthy_and_come_first() -> None:
    recs = [record(f"t.py::test_{name}", "healthy") for name in ("a", "b", "c", "d", "e")]
    seen = outcomes(test_a="passed", test_b="failed", test_c="passed", test_d="failed", test_e="passed")
    regressed = BaselineResult("regressed", ["grad_norm at '0' 101x smaller at first (step 0)", "two", "three"], "p")
    baselines = {"t.py::test_b": regressed, "t.py::test_d": regressed, "t.py::test_a": BaselineResult("matched")}
    text = markdown.summary(recs, gate="fail", outcomes=seen, baselines=baselines)
    assert "All 5 watched runs healthy" not in text
    assert text.splitlines()[2] == (
        "**2 of 5 tests watching training failed** (runs: 0 of 5 unhealthy; baselines: 2 regressed, 1 matched; "
        "gate: fail)."
    )
    assert text.splitlines()[4] == "pytest, whole session: 2 failed, 3 passed."
    rows = table_rows(text)
    assert rows[:2] == [
        f"| `t.py::test_{name}` | **failed** | ✅ healthy | - | - | - | ❌ regressed |" for name in "bd"
    ]
    assert rows[2] == "| `t.py::test_a` | passed | ✅ healthy | - | - | - | ✅ matched |"
    assert "### ❌ `t.py::test_b`: baseline regressed\n\n- grad\\_norm at '0' 101x" in text


def test_every_outcome_is_shown_beside_the_verdict_and_expected_failures_say_so() -> None:
    asserted = dict(hypothesis(), asserted=True)
    recs = [
        record("t.py::test_gate"),
        record("t.py::test_xfail"),
        record("t.py::test_caught", hypotheses=[asserted]),
        record("t.py::test_setup"),
    ]
    text = markdown.summary(
        recs, outcomes=outcomes(test_gate="failed", test_xfail="xfailed", test_caught="passed", test_setup="error")
    )
    cells = {row.split(" | ")[0]: row.split(" | ")[1:3] for row in table_rows(text)}
    assert cells == {
        "| `t.py::test_gate`": ["**failed**", "❌ unhealthy"],
        "| `t.py::test_xfail`": ["xfailed", "❌ unhealthy (expected: xfail)"],
        "| `t.py::test_caught`": ["passed", "❌ unhealthy (expected by the test)"],
        "| `t.py::test_setup`": ["**error**", "❌ unhealthy"],
    }
    assert (
        "### ❌ `t.py::test_caught`\n\n**dead\\_neurons at '3' from step 0 (confidence 1.00) (asserted by the test)**"
        in text
    )
    assert text.splitlines()[4] == "pytest, whole session: 1 failed, 1 passed, 1 xfailed, 1 error."


def test_a_baseline_test_that_watched_no_run_has_a_row_of_its_own() -> None:
    text = markdown.summary(
        [],
        outcomes=outcomes(test_idle="failed"),
        baselines={
            "t.py::test_idle": BaselineResult(
                "no run",
                ["NeuralDBG baseline: t.py::test_idle has @pytest.mark.neuraldbg(baseline=True) but watched no run"],
            )
        },
    )
    assert table_rows(text) == ["| `t.py::test_idle` | **failed** | - (no run watched) | - | - | - | ❌ no run |"]
    assert (
        "- NeuralDBG baseline: t.py::test\\_idle has @pytest.mark.neuraldbg(baseline=True) but watched no run" in text
    )
    assert text.splitlines()[2].startswith("**1 of 1 test watching training failed**")


def test_a_test_with_several_runs_names_each_run() -> None:
    text = markdown.summary([record("t.py::test_two", run="a"), record("t.py::test_two", "healthy", run="b")])
    assert "`t.py::test_two [run a]`" in text and "`t.py::test_two [run b]`" in text


def test_the_summary_fits_a_github_comment_and_says_what_it_left_out() -> None:
    big_graph = "flowchart TD\n" + "\n".join(f'  n{i}["{"x" * 60}"]' for i in range(400))
    recs = [record(f"tests/test_many.py::test_{i}", mermaid=big_graph) for i in range(30)]
    recs += [record(f"tests/test_many.py::test_ok_{i}", "healthy") for i in range(2000)]
    text = markdown.summary(recs)
    assert len(text) <= markdown.COMMENT_LIMIT
    assert re.search(r"_\d+ more rows not listed: GitHub limits a comment to 65,536 characters._", text)
    assert "_Graphs left out to stay within GitHub's size limit" in text
    assert re.search(r"_\d+ more sections left out to stay within 65,536 characters", text)
    assert text.count("| ❌ unhealthy |") == 30  # unhealthy rows come first and are kept


def test_healthy_runs_that_do_not_all_fit_are_listed_as_far_as_they_fit_and_the_rest_counted() -> None:
    numbers = {"final_loss": 0.0123, "grad_step": 2, "grad_min": ["0", 3e-4], "grad_max": ["2", 1.25]}
    ids = [f"test_many.py::test_trains[case-{i:04d}-{'p' * 300}]" for i in range(200)]
    recs = [record(nodeid, "healthy", numbers=numbers) for nodeid in ids]
    every = [markdown.healthy_line(r, nodeid) for r, nodeid in zip(recs, ids)]
    text = markdown.summary(recs)
    listed = [line for line in text.splitlines() if line.startswith("- ✅ ")]
    assert 0 < len(listed) < len(every)  # not all of them fit, and not none either
    assert listed == every[: len(listed)]  # the first ones, in order
    left_out = len(every) - len(listed)
    assert f"_{left_out} more healthy runs not listed: GitHub limits a comment to 65,536 characters._" in text
    assert "sections left out" not in text
    assert markdown.COMMENT_LIMIT - 1_000 < len(text) <= markdown.COMMENT_LIMIT  # the room there was is used


def test_an_analysis_error_is_listed_with_its_message() -> None:
    text = markdown.summary([record("t.py::test_x", "error", error="NeuralDBG could not summarise this run: boom")])
    assert "could not be analysed" in text and "### ⚠️ `t.py::test_x`" in text and "boom" in text


def test_the_chart_renders_with_real_mermaid() -> None:
    mermaidx = pytest.importorskip("mermaidx")
    source, _ = markdown.xychart(
        [{"label": "a", "points": [[0, 0.0], [1, 1e-8]]}, {"label": "b", "points": [[0, math.inf], [1, 3.0]]}]
    )
    assert "<svg" in mermaidx.render(source).svg()


def test_a_newline_or_tab_in_a_name_shown_as_code_is_a_visible_escape_not_a_space() -> None:
    """Test ids and layer names go into code spans (the table's cells, headings, healthy lines): two names that
    differ by a newline must not read alike."""
    assert markdown.code("new\nline\tand\rcr") == "`new\\x0aline\\x09and\\x0dcr`"
    assert markdown.code("new\nline") != markdown.code("new line")
    assert markdown.code("a  b", table=True) == "`a b`"  # spaces are still folded
