"""``summary.md``: a Markdown report of the watched runs, for ``$GITHUB_STEP_SUMMARY`` or a PR comment.

GitHub renders the ```` ```mermaid ```` blocks: each unhealthy run gets its causal graph and a line chart of
the gradient norm (log10) of its first, root and last layers, both collapsed in ``<details>``. The file stays
under 65,536 characters (the limit of a GitHub comment, far below the 1 MiB of a step summary): past it, rows
and sections are left out with a note saying how many. Pure functions of the run records; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from . import records

COMMENT_LIMIT = 65_536  # characters in a GitHub issue or PR comment
MAX_CHART_POINTS = 40
PALETTE = (("#1f77b4", "🔵"), ("#d62728", "🔴"), ("#2ca02c", "🟢"))
ICONS = {records.HEALTHY: "✅", records.UNHEALTHY: "❌", records.ERROR: "⚠️"}

_MD_SPECIAL = set("\\`*_{}[]<>#|~")


def escape(text: str) -> str:
    """Text safe in Markdown: every character Markdown could read as syntax is backslash-escaped."""
    return "".join("\\" + c if c in _MD_SPECIAL else c for c in text)


def cell(text: str) -> str:
    """Text safe in a table cell: escaped, on one line."""
    return escape(" ".join(text.split()))


def code(text: str) -> str:
    """An inline code span (backticks inside are replaced: a span cannot escape them)."""
    return "`" + " ".join(text.replace("`", "'").split()) + "`"


# --- the gradient chart -----------------------------------------------------------------------------------


def _value(x: Any) -> float:
    return float(x)  # records hold non-finite numbers as "inf", "-inf", "nan": float() reads those


def _nearest(points: Sequence[Sequence[Any]], step: int) -> float:
    best = min(points, key=lambda p: abs(int(p[0]) - step))
    return _value(best[1])


def _sample(steps: list[int], limit: int) -> list[int]:
    if len(steps) <= limit:
        return steps
    picked = [steps[round(i * (len(steps) - 1) / (limit - 1))] for i in range(limit)]
    return list(dict.fromkeys(picked))


def _fmt(x: float) -> str:
    text = f"{x:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def xychart(series: Sequence[dict[str, Any]], *, max_points: int = MAX_CHART_POINTS) -> tuple[str, str]:
    """A Mermaid ``xychart-beta`` of log10 gradient norms, and the legend to print under it.

    ``series`` items have ``label`` and ``points`` (``[[step, norm], ...]``). Steps are the union over the
    series (at most ``max_points``, evenly spread); a series lacking a step takes its nearest recorded value.
    A zero norm (a dead path) is drawn one decade below the smallest nonzero norm, a non-finite one a
    decade above the largest; the legend says so.
    """
    series = [s for s in series if s["points"]][: len(PALETTE)]
    if not series:
        return "", ""
    steps = _sample(sorted({int(p[0]) for s in series for p in s["points"]}), max_points)
    raw = [[_nearest(s["points"], step) for step in steps] for s in series]
    logs = [math.log10(v) for row in raw for v in row if math.isfinite(v) and v > 0]
    low = math.floor(min(logs)) if logs else 0
    high = math.ceil(max(logs)) if logs else 0
    has_zero = any(math.isfinite(v) and v <= 0 for row in raw for v in row)
    has_bad = any(not math.isfinite(v) for row in raw for v in row)
    floor = low - 1 if has_zero else low
    ceiling = high + 1 if has_bad else max(high, floor + 1)

    def plotted(v: float) -> float:
        if not math.isfinite(v):
            return float(ceiling)
        return math.log10(v) if v > 0 else float(floor)

    palette = ", ".join(color for color, _ in PALETTE[: len(series)])
    lines = [
        '%%{init: {"themeVariables": {"xyChart": {"plotColorPalette": "' + palette + '"}}}}%%',
        "xychart-beta",
        '  title "Gradient norm (log10) over training steps"',
        f'  x-axis "step" [{", ".join(str(s) for s in steps)}]',
        f'  y-axis "log10 gradient norm" {floor} --> {ceiling}',
        *(f"  line [{', '.join(_fmt(plotted(v)) for v in row)}]" for row in raw),
    ]
    keys = " · ".join(f"{icon} {escape(s['label'])}" for s, (_, icon) in zip(series, PALETTE))
    if has_zero and has_bad:
        note = f" A zero gradient is drawn at {floor}, a non-finite one at {ceiling}."
    elif has_zero or has_bad:
        note = (
            f" A zero gradient is drawn at {floor}." if has_zero else f" A non-finite gradient is drawn at {ceiling}."
        )
    else:
        note = ""
    legend = f"Lines: {keys}.{note}"
    return "\n".join(lines), legend


# --- the summary ------------------------------------------------------------------------------------------


def _fence(kind: str, source: str) -> str:
    return f"```{kind}\n{source}\n```"


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"


def section(record: dict[str, Any], label: str, *, graphs: bool = True) -> str:
    """The part of the summary about one unhealthy (or failed-to-analyse) run."""
    parts = [f"### {ICONS.get(record['verdict'], '')} {code(label)}"]
    if record["verdict"] == records.ERROR:
        parts.append(escape(str(record.get("error", ""))))
        return "\n\n".join(parts)
    for h in record["hypotheses"]:
        parts.append(f"**{escape(h['summary'])}**\n\n{escape(h['explanation'])}")
    if graphs and record.get("mermaid"):
        parts.append(_details("Causal graph", _fence("mermaid", record["mermaid"])))
    chart, legend = xychart(record.get("grad_chart") or []) if graphs else ("", "")
    if chart:
        title = "Gradient norm over training (first, root and last layer)"
        parts.append(_details(title, f"{_fence('mermaid', chart)}\n\n{legend}"))
    if not graphs:
        parts.append("_Graphs left out to stay within GitHub's size limit; see the .mmd and .json files._")
    return "\n\n".join(parts)


def _labels(recs: Sequence[dict[str, Any]]) -> list[str]:
    per_test: dict[str, int] = {}
    for r in recs:
        per_test[r["nodeid"]] = per_test.get(r["nodeid"], 0) + 1
    return [records.run_label(r, per_test[r["nodeid"]]) for r in recs]


def summary(recs: Sequence[dict[str, Any]], *, gate: str = "off", limit: int = COMMENT_LIMIT) -> str:
    """The whole ``summary.md``: verdict counts, a table of runs, then each unhealthy run in detail."""
    order = {records.UNHEALTHY: 0, records.ERROR: 1, records.HEALTHY: 2}
    recs = sorted(recs, key=lambda r: order.get(r["verdict"], 3))  # stable: test order within a verdict
    labels = _labels(recs)
    bad = [(r, label) for r, label in zip(recs, labels) if r["verdict"] != records.HEALTHY]
    unhealthy = sum(r["verdict"] == records.UNHEALTHY for r in recs)
    head = ["## NeuralDBG training health", ""]
    if not recs:
        head.append("No training run was watched.")
        return "\n".join(head) + "\n"
    if unhealthy:
        verdict_text = f"**{unhealthy} of {len(recs)} watched runs unhealthy**"
    else:
        verdict_text = f"**All {len(recs)} watched runs healthy**"
    errors = len(recs) - unhealthy - sum(r["verdict"] == records.HEALTHY for r in recs)
    head.append(verdict_text + (f", {errors} could not be analysed" if errors else "") + f" (gate: {gate}).")
    budget = limit - 400  # room for the notes on what was left out
    text = "\n".join(head)

    table = ["", "| Test | Verdict | Steps | Failure hypotheses |", "|---|---|---|---|"]
    table_budget = budget // 2 if bad else budget  # leave room for the sections of unhealthy runs
    size = len(text) + sum(len(line) + 1 for line in table)
    left_out = 0
    for r, label in zip(recs, labels):
        found = "; ".join(h["summary"] for h in r["hypotheses"]) or ("-" if r["verdict"] == "healthy" else "error")
        row = f"| {code(label)} | {ICONS.get(r['verdict'], '')} {r['verdict']} | {r['steps']} | {cell(found)} |"
        if size + len(row) + 1 > table_budget:
            left_out += 1
            continue
        table.append(row)
        size += len(row) + 1
    text += "\n" + "\n".join(table)
    if left_out:
        text += f"\n\n_{left_out} more runs not listed: GitHub limits a comment to {limit:,} characters._"

    skipped = 0
    for r, label in bad:
        for graphs in (True, False):
            part = "\n\n" + section(r, label, graphs=graphs)
            if len(text) + len(part) <= budget:
                text += part
                break
        else:
            skipped += 1
    if skipped:
        text += (
            f"\n\n_{skipped} more unhealthy runs left out to stay within {limit:,} characters; see the .json files._"
        )
    return text + "\n"
