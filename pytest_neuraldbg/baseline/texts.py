"""What a baseline says to people: failure texts, the difference table, one-line phrases, the update command."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from .. import verdict
from .compare import CHANGED, IMPROVED, REGRESSED, Row, RunComparison

UPDATE_FLAG = "--neuraldbg-update-baselines"
MAX_ROWS = 40  # rows of a failure's table per run


def update_command(nodeid: str) -> str:
    return f"pytest {UPDATE_FLAG} {shlex.quote(nodeid)}"


def missing_text(path: str, nodeid: str) -> str:
    return (
        f"NeuralDBG baseline missing: {path} does not exist\n\n"
        f"Create it by running the test with {UPDATE_FLAG}, then review and commit the file:\n"
        f"  {update_command(nodeid)}"
    )


def invalid_text(path: str, nodeid: str, problem: str) -> str:
    return (
        f"NeuralDBG baseline {path} {problem}\n\n"
        f"Fix the file, or write it again from this run with {UPDATE_FLAG} and review the diff:\n"
        f"  {update_command(nodeid)}"
    )


def table(rows: Sequence[Row]) -> list[str]:
    head = ("metric", "layer", "point", "baseline", "now", "tolerance", "change")
    cells = [
        head,
        *((r.metric, r.layer or "-", r.point or "-", r.baseline, r.now, r.tolerance, r.change) for r in rows),
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]


def regression_text(
    comparisons: Sequence[RunComparison],
    problems: Sequence[str],
    *,
    path: str,
    nodeid: str,
    hypotheses: Mapping[str, list[dict[str, Any]]],
    several: bool,
) -> str:
    """The failure text: one verdict line, the file, a table per run, the engine's diagnosis, how to refresh."""
    phrases = [*problems, *(f"{in_run(c.run, several)}{r.what}" for c in comparisons for r in c.regressions)]
    first = f"NeuralDBG baseline regression: {phrases[0]}"
    if len(phrases) > 1:
        first += f"; +{len(phrases) - 1} more"
    lines = [verdict.short(first, verdict.MAX_HEADLINE), "", f"Baseline: {path}"]
    lines += [f"  {p}" for p in problems]
    for c in comparisons:
        if not c.rows:
            continue
        shown_rows = c.rows[:MAX_ROWS]
        lines += ["", f"run {c.run}:" if several else "Differences beyond tolerance:", *table(shown_rows)]
        if len(c.rows) > MAX_ROWS:
            lines.append(f"... and {len(c.rows) - MAX_ROWS} more differences")
    for c in comparisons:
        found = hypotheses.get(c.run) or []
        if c.regressions and found:
            label = f" of run {c.run}" if several else ""
            lines += ["", verdict.headline(found, f"NeuralDBG's diagnosis{label}: training is unhealthy")]
            lines += [verdict.describe(h, i if len(found) > 1 else None) for i, h in enumerate(found, 1)]
    lines += ["", "If the change is intended, refresh the baseline and commit it:", f"  {update_command(nodeid)}"]
    return "\n".join(lines)


def grouped(rows: Sequence[Row]) -> list[str]:
    """One phrase per metric and layer (its first point, and how many more): verdicts, improved, changed."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.metric, row.layer, row.change), []).append(row)
    rank = {"verdict": 0, IMPROVED: 1, REGRESSED: 1, CHANGED: 2}
    ordered = sorted(groups.values(), key=lambda g: rank["verdict"] if g[0].metric == "verdict" else rank[g[0].change])
    more = {1: "", 2: " (+1 more point)"}
    return [g[0].what + more.get(len(g), f" (+{len(g) - 1} more points)") for g in ordered]


def in_run(run: str, several: bool) -> str:
    """``"run <name>: "`` before a phrase when the test has several runs, else nothing."""
    return f"run {run}: " if several else ""


def environment_text(path: str, differences: Sequence[str]) -> str:
    return (
        f"NeuralDBG baseline {path} was recorded in another environment ({'; '.join(differences)}); "
        f"training statistics may differ. Compared anyway; if this environment is the reference now, "
        f"refresh it with {UPDATE_FLAG}."
    )
