"""``summary.md``: a Markdown report of the watched runs, for ``$GITHUB_STEP_SUMMARY`` or a PR comment.

The verdict agrees with pytest: the first sentence says how many tests that watched training failed (a gate
failure, a baseline regression or their own assertion), then how many runs are unhealthy and how baselines
came out, then pytest's own counts for the session. The table has one row per watched run with its test's
outcome (passed, failed, xfailed, error, ...) beside the training verdict and the baseline result. GitHub
renders the ```` ```mermaid ```` blocks: each unhealthy run gets its causal graph and a line chart of the
gradient norm (log10) of its first, root and last layers, both collapsed in ``<details>``; each failed baseline
lists its worst differences. The file stays under 65,536 characters (the limit of a GitHub comment, far below the
1 MiB of a step summary): past it, rows, sections and healthy-run lines are left out with a note saying how many.
Pure functions of the run records; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from neuraldbg.export.inert import inert
from neuraldbg.text import cut, nearest, num

from . import records
from .outcomes import BAD, BASELINE_ORDER, BaselineResult, Outcomes
from .records import ChartSeries, RunRecord

COMMENT_LIMIT = 65_536  # characters in a GitHub issue or PR comment
MAX_CHART_POINTS = 40
TEST_CELL = 80  # characters of a test id in a table cell; the section below gives it whole
LAYER_CELL = 40  # characters of a layer name in a table cell
PALETTE = (("#1f77b4", "🔵"), ("#d62728", "🔴"), ("#2ca02c", "🟢"))
ICONS = {records.HEALTHY: "✅", records.UNHEALTHY: "❌", records.ERROR: "⚠️"}

_MD_SPECIAL = set("\\`*_{}[]<>#|~&")


def escape(text: str) -> str:
    """Text safe in Markdown, tables included: control and bidirectional characters become visible escapes (see
    :mod:`neuraldbg.export.inert`), then every character Markdown could read as syntax is backslash-escaped (``|``
    too, which a GitHub table splits cells on before anything else; ``[`` so no link forms; ``&`` so no character
    reference decodes into a character that was escaped)."""
    return "".join("\\" + c if c in _MD_SPECIAL else c for c in inert(text))


def cell(text: str) -> str:
    """Text safe in a table cell: escaped, on one line."""
    return escape(" ".join(text.split()))


def code(text: str, *, table: bool = False, limit: int = 0) -> str:
    """An inline code span of inert text on one line (backticks inside are replaced: a span cannot escape them). A
    name's newline, tab or carriage return is shown as its visible escape (``new\\x0aline``, as everywhere else),
    not folded into a space that would make two names look alike; runs of spaces are folded.

    ``table``: the span stands in a table cell, where GitHub splits cells on ``|`` even inside a code span (before
    parsing the span), so ``|`` is written ``\\|``, which the table turns back into ``|`` inside the span. ``limit``:
    at most this many characters, cut with an ellipsis (0: no limit).
    """
    text = " ".join(inert(text.replace("`", "'")).split())
    text = cut(text, limit) if limit else text
    return "`" + (text.replace("|", "\\|") if table else text) + "`"


# --- the gradient chart -----------------------------------------------------------------------------------


def _value(x: Any) -> float:
    return float(x)  # records hold non-finite numbers as "inf", "-inf", "nan": float() reads those


def _fmt(x: float) -> str:
    text = f"{x:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def grid(first: int, last: int, max_points: int) -> list[float]:
    """Evenly spaced steps from ``first`` to ``last``: every step when they fit in ``max_points``, else
    ``max_points`` of them (not whole steps then). A numeric x-axis spreads a line's values evenly over its range,
    so the values must be taken at evenly spaced steps for the axis to tell the truth."""
    count = min(max_points, last - first + 1)
    if count < 2:
        return [float(first)]
    return [first + i * (last - first) / (count - 1) for i in range(count)]


def valid_chart(source: str) -> bool:
    """Whether an ``xychart-beta`` source is one Mermaid draws: a numeric x-axis ``a --> b`` with ``a < b``, a
    y-axis with ``low < high``, and lines of at least two finite values (an invalid axis makes some Mermaid releases
    loop for ever)."""
    import re

    x_axis = re.search(r'^  x-axis "[^"]*" (-?[0-9.]+) --> (-?[0-9.]+)$', source, re.M)
    y_axis = re.search(r'^  y-axis "[^"]*" (-?[0-9.]+) --> (-?[0-9.]+)$', source, re.M)
    lines = re.findall(r"^  line \[(.*)\]$", source, re.M)
    if x_axis is None or y_axis is None or not lines:
        return False
    bounds = [float(v) for v in (*x_axis.groups(), *y_axis.groups())]
    if not all(math.isfinite(v) for v in bounds) or not (bounds[0] < bounds[1] and bounds[2] < bounds[3]):
        return False
    for line in lines:
        values = [float(v) for v in line.split(", ")]
        if len(values) < 2 or not all(math.isfinite(v) and bounds[2] <= v <= bounds[3] for v in values):
            return False
    return True


def xychart(
    series: Sequence[ChartSeries], *, max_points: int = MAX_CHART_POINTS, last_step: int | None = None
) -> tuple[str, str]:
    """A Mermaid ``xychart-beta`` of log10 gradient norms over a true step axis, and the legend to print under it.

    ``series`` items have ``label`` and ``points`` (``[[step, norm], ...]``). The x-axis is numeric, from the first
    recorded step to the run's ``last_step`` (or the last recorded one, if later): the whole run. Each line takes,
    at evenly spaced steps, the value of its nearest recorded point, and the legend says where a line's recorded
    steps end. Lines that would be
    drawn on top of each other are one line, with both labels. A zero norm (a dead path) is drawn one decade below
    the smallest nonzero norm, a non-finite one a decade above the largest; the legend says so. Returns
    ``("", "")`` when no valid chart can be drawn (fewer than two steps).
    """
    series = [s for s in series if s["points"]]
    if not series:
        return "", ""
    recorded = [[(int(p[0]), _value(p[1])) for p in s["points"]] for s in series]
    first = min(points[0][0] for points in recorded)
    last = max([points[-1][0] for points in recorded] + ([last_step] if last_step is not None else []))
    steps = grid(first, last, max_points)
    if len(steps) < 2:
        return "", ""
    raw = [[float(nearest(points, round(step)) or 0.0) for step in steps] for points in recorded]
    labels = [str(s["label"]) for s in series]
    merged_raw: list[list[float]] = []
    merged_labels: list[str] = []
    merged_points: list[list[tuple[int, float]]] = []
    for row, text, points in zip(raw, labels, recorded):
        same = next((i for i, other in enumerate(merged_raw) if _overlaps(other, row)), None)
        if same is not None:
            merged_labels[same] += f" = {text}"
            continue
        merged_raw.append(row)
        merged_labels.append(text)
        merged_points.append(points)
    raw, labels, recorded = merged_raw[: len(PALETTE)], merged_labels[: len(PALETTE)], merged_points[: len(PALETTE)]
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

    palette = ", ".join(color for color, _ in PALETTE[: len(raw)])
    lines = [
        '%%{init: {"themeVariables": {"xyChart": {"plotColorPalette": "' + palette + '"}}}}%%',
        "xychart-beta",
        '  title "Gradient norm (log10) over training steps"',
        f'  x-axis "step" {first} --> {last}',
        f'  y-axis "log10 gradient norm" {floor} --> {ceiling}',
        *(f"  line [{', '.join(_fmt(plotted(v)) for v in row)}]" for row in raw),
    ]
    source = "\n".join(lines)
    if not valid_chart(source):
        return "", ""
    keys = " · ".join(f"{icon} {escape(text)}" for text, (_, icon) in zip(labels, PALETTE))
    notes = []
    if has_zero and has_bad:
        notes.append(f"A zero gradient is drawn at {floor}, a non-finite one at {ceiling}.")
    elif has_zero or has_bad:
        notes.append(
            f"A zero gradient is drawn at {floor}." if has_zero else f"A non-finite gradient is drawn at {ceiling}."
        )
    for text, points in zip(labels, recorded):
        if points[0][0] > first or points[-1][0] < last:
            where = f"steps {points[0][0]}-{points[-1][0]}" if len(points) > 1 else f"step {points[0][0]}"
            notes.append(f"{escape(text)} was recorded at {where} only; its line holds the nearest recorded value.")
    return source, " ".join([f"Lines: {keys}.", *notes])


def _overlaps(a: Sequence[float], b: Sequence[float]) -> bool:
    """Two lines that would be drawn as one (equal values, non-finite ones alike)."""
    return all(x == y or (not math.isfinite(x) and not math.isfinite(y)) for x, y in zip(a, b))


# --- the summary ------------------------------------------------------------------------------------------


def _fence(kind: str, source: str) -> str:
    return f"```{kind}\n{source}\n```"


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"


def section(
    record: RunRecord, label: str, *, graphs: bool = True, pictures: Sequence[str] = (), passed: bool = False
) -> str:
    """The part of the summary about one unhealthy (or failed-to-analyse) run. ``pictures``: the run's picture
    files, relative to the summary (linked, and the first one shown). ``passed``: the test passed, so a failure an
    assertion helper raised on was caught on purpose (said after its summary)."""
    parts = [f"### {ICONS.get(record['verdict'], '')} {code(label)}"]
    if record["verdict"] == records.ERROR:
        parts.append(escape(str(record.get("error", ""))))
        return "\n\n".join(parts)
    for h in record["hypotheses"]:
        asserted = " (asserted by the test)" if passed and h.get("asserted") else ""
        parts.append(f"**{escape(h['summary'] + asserted)}**\n\n{escape(h['explanation'])}")
    if pictures:
        parts.append(_pictures(pictures))
    if graphs and record.get("mermaid"):
        parts.append(_details("Causal graph", _fence("mermaid", record["mermaid"])))
    last = int(record["steps"]) - 1 if record.get("steps") else None
    chart, legend = xychart(record.get("grad_chart") or [], last_step=last) if graphs else ("", "")
    if chart:
        title = "Gradient norm over training (first, root and last layer)"
        parts.append(_details(title, f"{_fence('mermaid', chart)}\n\n{legend}"))
    if not graphs:
        parts.append("_Graphs left out to stay within GitHub's size limit; see the .mmd and .json files._")
    return "\n\n".join(parts)


def _pictures(paths: Sequence[str]) -> str:
    """The first picture shown, every picture linked (relative paths of files the report folder holds)."""
    links = " · ".join(f"[{escape(_picture_name(p))}]({_href(p)})" for p in paths)
    return f"![{escape(_picture_name(paths[0]))}]({_href(paths[0])})\n\nPictures: {links}"


def _picture_name(path: str) -> str:
    stem = path.rsplit("/", 1)[-1].rsplit(".", 1)
    return f"{stem[0].rsplit('.', 1)[-1]} ({stem[1]})" if len(stem) == 2 else path


def _href(path: str) -> str:
    """A relative link target: percent-encoded, so no character of a file name ends or changes the link."""
    from urllib.parse import quote

    return quote(path, safe="/._-")


def failure_section(nodeid: str, message: str, record: RunRecord | None) -> str:
    """A failed test whose watched run is healthy (``assert_learns``, its own assertion, an error): its failure."""
    verdict = f" (its run was {record['verdict']})" if record is not None else ""
    fence = "~~~~"
    body = inert(message, lines=True).replace(fence, "~ ~ ~ ~")
    return f"### ❌ {code(nodeid)}: test failed{verdict}\n\n{fence}text\n{body}\n{fence}"


def healthy_line(record: RunRecord, label: str) -> str:
    """A healthy run's key numbers in one line: steps, final loss, the largest and smallest gradient norms."""
    numbers = record.get("numbers") or {}
    parts = [_count(int(record["steps"]), "step")]
    loss = numbers.get("final_loss")
    if loss is not None:
        parts.append(f"final loss {num(float(loss))}")
    high, low = numbers.get("grad_max"), numbers.get("grad_min")
    if high and low:
        at = numbers.get("grad_step")
        when = f" at step {at}" if at is not None else ""
        parts.append(
            f"gradient norm{when} from {num(float(low[1]))} ({code(str(low[0]))}) "
            f"to {num(float(high[1]))} ({code(str(high[0]))})"
        )
    return f"- ✅ {code(label)}: {', '.join(parts)}"


def labels(recs: Sequence[RunRecord]) -> list[str]:
    """Each record's label: its test, and its run when the test watched several."""
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


def _root_cells(record: RunRecord | None) -> str:
    """Kind, layer and step of the run's first hypothesis (the root cause), three cells."""
    if record is None or not record["hypotheses"]:
        return "- | - | -"
    first = record["hypotheses"][0]
    more = f" +{len(record['hypotheses']) - 1}" if len(record["hypotheses"]) > 1 else ""
    layer = code(str(first["layer"]), table=True, limit=LAYER_CELL) if first["layer"] else "the model"
    return f"{cell(str(first['kind']))}{more} | {layer} | {int(first['step'])}"


def _baseline_cell(result: BaselineResult | None) -> str:
    if result is None:
        return "-"
    icon = "❌ " if result.failed else ("✅ " if result.status in ("matched", "improved") else "")
    return cell(f"{icon}{result.status}")


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
        runs = "watched run is" if len(recs) == 1 else "watched runs are"
        first = f"**No test watching training failed, but {len(unhealthy)} of {len(recs)} {runs} unhealthy**"
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
    pictures: Mapping[int, Sequence[str]] | None = None,
    stopped: str = "",
    note: str = "",
) -> str:
    """The whole ``summary.md``: the verdict, a narrow table (test, outcome, training verdict, root kind, layer and
    step, baseline; one row per watched run, and one per baseline test that watched none), then a section for every
    failing or unhealthy row (the explanations, pictures and graphs; a failed baseline's differences; a failed test's
    own failure), then the healthy runs' key numbers, one line each. Tests that failed come first, then unhealthy
    runs. ``pictures``: per record (by ``id``), its picture files relative to the summary. ``stopped``: why the
    session stopped early (``-x``). ``note``: a line at the end (how to get pictures)."""
    baselines = dict(baselines or {})
    pictures = pictures or {}
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
    labels_of = dict(zip(map(id, recs), labels(recs)))
    head = ["## NeuralDBG training health", ""]
    if stopped:
        head += [f"**The session stopped early ({escape(stopped)}): tests after it did not run.**", ""]
    if not rows:
        head.append("No training run was watched.")
        if outcomes is not None and outcomes.counts:
            head += ["", f"pytest, whole session: {outcomes.text()}."]
        return "\n".join(head) + "\n"
    head += _headline(rows, outcomes, baselines, gate)
    budget = limit - 400  # room for the notes on what was left out
    text = "\n".join(head)

    bad = [(r, labels_of[id(r)]) for _, r in rows if r is not None and r["verdict"] != records.HEALTHY]
    failed_baselines = [
        (n, baselines[n]) for n in dict.fromkeys(n for n, _ in rows) if n in baselines and baselines[n].failed
    ]
    explained = {str(r["nodeid"]) for r, _ in bad} | {n for n, _ in failed_baselines}
    messages = outcomes.messages if outcomes is not None else {}
    failed_tests = [
        (nodeid, rec)
        for nodeid, rec in rows
        if outcome_of(nodeid) in BAD and nodeid not in explained and (rec is None or id(rec) == _first_of(rows, nodeid))
    ]
    table = [
        "",
        "| Test | Outcome | Training | Kind | Layer | Step | Baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    table_budget = budget // 2 if bad or failed_baselines or failed_tests else budget  # room for the sections
    size = len(text) + sum(len(line) + 1 for line in table)
    left_out = 0
    for nodeid, r in rows:
        outcome = outcome_of(nodeid)
        label = labels_of[id(r)] if r is not None else nodeid
        row = (
            f"| {code(label, table=True, limit=TEST_CELL)} | {_outcome_cell(outcome)} | {_training_cell(r, outcome)} | "
            f"{_root_cells(r)} | {_baseline_cell(baselines.get(nodeid))} |"
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
    for nodeid, rec in failed_tests:
        part = "\n\n" + failure_section(nodeid, messages.get(nodeid, "(no failure text recorded)"), rec)
        if len(text) + len(part) <= budget:
            text += part
        else:
            skipped += 1
    for r, label in bad:
        for graphs in (True, False):
            passed = outcome_of(str(r["nodeid"])) == "passed"
            part = "\n\n" + section(r, label, graphs=graphs, pictures=pictures.get(id(r), ()), passed=passed)
            if len(text) + len(part) <= budget:
                text += part
                break
        else:
            skipped += 1
    healthy = [(r, labels_of[id(r)]) for _, r in rows if r is not None and r["verdict"] == records.HEALTHY]
    if healthy:
        part = "\n\n### ✅ Healthy runs\n\n"
        kept = _fitting([healthy_line(r, label) for r, label in healthy], budget - len(text) - len(part))
        if kept:
            text += part + "\n".join(kept)
            if len(kept) < len(healthy):
                text += (
                    f"\n\n_{len(healthy) - len(kept)} more healthy runs not listed: "
                    f"GitHub limits a comment to {limit:,} characters._"
                )
        else:
            skipped += 1
    if skipped:
        text += f"\n\n_{skipped} more sections left out to stay within {limit:,} characters; see the .json files._"
    if note:
        text += f"\n\n_{escape(note)}_"
    return text + "\n"


def _fitting(lines: Sequence[str], room: int) -> list[str]:
    """The first ``lines`` that fit in ``room`` characters, one per line: each healthy run is worth a line, so as
    many are listed as fit, in order, rather than none when not all of them do."""
    kept: list[str] = []
    for line in lines:
        room -= len(line) + 1
        if room < 0:
            break
        kept.append(line)
    return kept


def _first_of(rows: Sequence[tuple[str, RunRecord | None]], nodeid: str) -> int:
    """The ``id`` of the first record of a test (a failed test gets one failure section, not one per run)."""
    return next(id(rec) for n, rec in rows if n == nodeid)
