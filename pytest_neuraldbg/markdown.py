"""``summary.md``: a Markdown report of the watched runs, for ``$GITHUB_STEP_SUMMARY`` or a PR comment.

The verdict agrees with pytest: the first sentence says how many tests that watched training failed (a gate
failure, a baseline regression or their own assertion), then how many runs are unhealthy and how baselines
came out, then pytest's own counts for the session. The table has one row per watched run with its test's
outcome (passed, failed, xfailed, error, ...) beside the training verdict and the baseline result. GitHub
renders the ```` ```mermaid ```` blocks: each unhealthy run gets its causal graph and a line chart of the
gradient norm (log10) of its first, root and last layers, both collapsed in ``<details>``; each failed baseline
lists its worst differences. The file stays
under 65,536 characters (the limit of a GitHub comment, far below the 1 MiB of a step summary): past it, rows
and sections are left out with a note saying how many. Pure functions of the run records; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from . import records
from .outcomes import BAD, BASELINE_ORDER, BaselineResult, Outcomes
from .records import ChartSeries, RunRecord

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


def xychart(series: Sequence[ChartSeries], *, max_points: int = MAX_CHART_POINTS) -> tuple[str, str]:
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


def section(record: RunRecord, label: str, *, graphs: bool = True) -> str:
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


def _labels(recs: Sequence[RunRecord]) -> list[str]:
    per_test: dict[str, int] = {}
    for r in recs:
        per_test[r["nodeid"]] = per_test.get(r["nodeid"], 0) + 1
    return [records.run_label(r, per_test[r["nodeid"]]) for r in recs]


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _outcome_cell(outcome: str) -> str:
    return f"**{outcome}**" if outcome in BAD else (outcome or "-")


def _training_cell(record: RunRecord | None, outcome: str) -> str:
    if record is None:
        return "- (no run watched)"
    text = f"{ICONS.get(record['verdict'], '')} {record['verdict']}"
    hypotheses = record["hypotheses"]
    if outcome == "passed" and hypotheses and all(h.get("asserted") for h in hypotheses):
        text += " (expected by the test)"
    elif outcome == "xfailed" and record["verdict"] == records.UNHEALTHY:
        text += " (expected: xfail)"
    return text


def _baseline_cell(result: BaselineResult | None) -> str:
    if result is None:
        return "-"
    icon = "❌ " if result.failed else ("✅ " if result.status in ("matched", "improved") else "")
    first = f": {result.lines[0]}" if result.failed and result.lines else ""
    more = f" (+{len(result.lines) - 1} more)" if first and len(result.lines) > 1 else ""
    return cell(f"{icon}{result.status}{first}{more}")


def _hypotheses_cell(record: RunRecord | None, outcome: str) -> str:
    if record is None:
        return "-"
    if record["verdict"] == records.ERROR:
        return "error"
    expected = outcome == "passed"
    found = [
        h["summary"] + (" (asserted by the test)" if expected and h.get("asserted") else "")
        for h in record["hypotheses"]
    ]
    return cell("; ".join(found)) if found else "-"


def _headline(
    rows: Sequence[tuple[str, RunRecord | None]],
    outcomes: Outcomes | None,
    baselines: Mapping[str, BaselineResult],
    gate: str,
) -> list[str]:
    """The verdict sentence (about tests, then runs and baselines), and pytest's own counts."""
    recs = [r for _, r in rows if r is not None]
    tests = list(dict.fromkeys(nodeid for nodeid, _ in rows))
    failed = [t for t in tests if outcomes is not None and outcomes.of(t) in BAD]
    unhealthy = [r for r in recs if r["verdict"] == records.UNHEALTHY]
    errors = sum(r["verdict"] == records.ERROR for r in recs)
    if failed:
        first = f"**{len(failed)} of {_count(len(tests), 'test')} watching training failed**"
    elif unhealthy:
        first = f"**No test watching training failed, but {len(unhealthy)} of {len(recs)} watched runs are unhealthy**"
    elif recs:
        first = f"**All {_count(len(recs), 'watched run')} healthy**"
    else:
        first = f"**No training run was watched by the {_count(len(tests), 'test')} with a baseline**"
    details = [
        f"runs: {len(unhealthy)} of {len(recs)} unhealthy" + (f", {errors} could not be analysed" if errors else "")
    ]
    if baselines:
        statuses: dict[str, int] = {}
        for t in tests:
            if t in baselines:
                statuses[baselines[t].status] = statuses.get(baselines[t].status, 0) + 1
        order = [*BASELINE_ORDER, "unchanged", "matched"]
        ranked = sorted(statuses, key=lambda s: order.index(s) if s in order else len(order))
        details.append("baselines: " + ", ".join(f"{statuses[status]} {status}" for status in ranked))
    lines = [f"{first} ({'; '.join(details)}; gate: {gate})."]
    if outcomes is not None and outcomes.counts:
        lines += ["", f"pytest, whole session: {outcomes.text()}."]
    return lines


def _baseline_section(nodeid: str, result: BaselineResult, limit: int = 5) -> str:
    lines = [f"### ❌ {code(nodeid)}: baseline {escape(result.status)}", ""]
    lines += [f"- {escape(line)}" for line in result.lines[:limit]]
    if len(result.lines) > limit:
        lines.append(f"- … and {len(result.lines) - limit} more")
    if result.path:
        lines += ["", f"Baseline file: {code(result.path)}"]
    return "\n".join(lines)


def summary(
    recs: Sequence[RunRecord],
    *,
    gate: str = "off",
    outcomes: Outcomes | None = None,
    baselines: Mapping[str, BaselineResult] | None = None,
    limit: int = COMMENT_LIMIT,
) -> str:
    """The whole ``summary.md``: the verdict, a table (test outcome, training verdict, baseline, steps,
    failure hypotheses; one row per watched run, and one per baseline test that watched none), then each
    unhealthy run and each failed baseline in detail. Tests that failed come first, then unhealthy runs."""
    baselines = dict(baselines or {})
    outcome_of = outcomes.of if outcomes is not None else (lambda _: "")
    rows: list[tuple[str, RunRecord | None]] = [(str(r["nodeid"]), r) for r in recs]
    watched = {nodeid for nodeid, _ in rows}
    rows += [(nodeid, None) for nodeid in sorted(baselines) if nodeid not in watched]

    def rank(row: tuple[str, RunRecord | None]) -> int:
        nodeid, rec = row
        if outcome_of(nodeid) in BAD:
            return 0
        return {records.UNHEALTHY: 1, records.ERROR: 2}.get(rec["verdict"] if rec is not None else "", 3)

    rows.sort(key=rank)  # stable: test order within a rank
    labels = dict(zip(map(id, recs), _labels(recs)))
    head = ["## NeuralDBG training health", ""]
    if not rows:
        head.append("No training run was watched.")
        if outcomes is not None and outcomes.counts:
            head += ["", f"pytest, whole session: {outcomes.text()}."]
        return "\n".join(head) + "\n"
    head += _headline(rows, outcomes, baselines, gate)
    budget = limit - 400  # room for the notes on what was left out
    text = "\n".join(head)

    bad = [(r, labels[id(r)]) for _, r in rows if r is not None and r["verdict"] != records.HEALTHY]
    failed_baselines = [
        (n, baselines[n]) for n in dict.fromkeys(n for n, _ in rows) if n in baselines and baselines[n].failed
    ]
    table = [
        "",
        "| Test | Outcome | Training | Baseline | Steps | Failure hypotheses |",
        "|---|---|---|---|---|---|",
    ]
    table_budget = budget // 2 if bad or failed_baselines else budget  # leave room for the sections below
    size = len(text) + sum(len(line) + 1 for line in table)
    left_out = 0
    for nodeid, r in rows:
        outcome = outcome_of(nodeid)
        label = labels[id(r)] if r is not None else nodeid
        row = (
            f"| {code(label)} | {_outcome_cell(outcome)} | {_training_cell(r, outcome)} | "
            f"{_baseline_cell(baselines.get(nodeid))} | {r['steps'] if r is not None else 0} | "
            f"{_hypotheses_cell(r, outcome)} |"
        )
        if size + len(row) + 1 > table_budget:
            left_out += 1
            continue
        table.append(row)
        size += len(row) + 1
    text += "\n" + "\n".join(table)
    if left_out:
        text += f"\n\n_{left_out} more rows not listed: GitHub limits a comment to {limit:,} characters._"

    skipped = 0
    for nodeid, result in failed_baselines:
        part = "\n\n" + _baseline_section(nodeid, result)
        if len(text) + len(part) <= budget:
            text += part
        else:
            skipped += 1
    for r, label in bad:
        for graphs in (True, False):
            part = "\n\n" + section(r, label, graphs=graphs)
            if len(text) + len(part) <= budget:
                text += part
                break
        else:
            skipped += 1
    if skipped:
        text += f"\n\n_{skipped} more sections left out to stay within {limit:,} characters; see the .json files._"
    return text + "\n"
