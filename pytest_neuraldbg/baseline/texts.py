"""What a baseline says to people: failure texts, the difference table, one-line phrases, the update command.

Every text and phrase here is inert (see :mod:`neuraldbg.export.inert`): a layer or run name, a test id or a
path, from the model or from a file, reaches the terminal, the JUnit files and the warnings with its control and
bidirectional characters as visible escapes (``\\x1b``, ``\\u202e``); a table's columns are measured on the
escaped cells.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from neuraldbg.export.inert import inert, inert_data
from neuraldbg.text import one_line

from ..records import HypothesisRecord
from ..verdict import MAX_HEADLINE, describe, headline
from .compare import CHANGED, IMPROVED, REGRESSED, Row, RunComparison, worst_per_group

UPDATE_FLAG = "--neuraldbg-update-baselines"
REMOVE_STALE_FLAG = "--neuraldbg-remove-stale-baselines"
MAX_ROWS = 20  # rows of a failure's regression table per run (one per metric and layer)


def update_command(nodeid: str) -> str:
    return f"pytest {UPDATE_FLAG} {shlex.quote(nodeid)}"


def missing_text(path: str, nodeid: str) -> str:
    return _failure(
        f"NeuralDBG baseline missing: {inert(path)} does not exist",
        f"Create it by running the test with {UPDATE_FLAG}, then review and commit the file:",
        f"  {inert(update_command(nodeid))}",
    )


def invalid_text(path: str, nodeid: str, problem: str) -> str:
    return _failure(
        f"NeuralDBG baseline {inert(path)} {inert(problem)}",
        f"Fix the file, or write it again from this run with {UPDATE_FLAG} and review the diff:",
        f"  {inert(update_command(nodeid))}",
    )


def unwritable_text(path: str, nodeid: str, problem: str) -> str:
    """The failure of a test whose baseline could not be written when updating (``problem``: what is in the way)."""
    return _failure(
        f"NeuralDBG baseline {inert(path)} {inert(problem)}",
        "Nothing was written. NeuralDBG writes a regular file there, creating its folders: remove or rename what "
        "is in the way (or make the folder writable), then write it again and review the diff:",
        f"  {inert(update_command(nodeid))}",
    )


def _failure(first: str, fix: str, command: str) -> str:
    """A failure text: what is wrong, a blank line, how to fix it, and the command (each line inert already)."""
    return f"{first}\n\n{fix}\n{command}"


def no_run_text(nodeid: str, marker: bool, empty: Sequence[str] = ()) -> str:
    """The failure of a baseline test that watched no training run (or only runs that took no step)."""
    nodeid = inert(nodeid)
    if empty:
        runs = ", ".join(inert(repr(name)) for name in empty)
        first = (
            f"NeuralDBG baseline: run {runs} of {nodeid} took no training step (0 steps observed), so there is "
            "nothing to compare with a baseline or to store in one"
        )
        fix = (
            "Does the data yield batches, and does the loop call optimizer.step() (or backward) under the debugger? "
            "neuraldbg.assert_healthy(ndbg) says what it saw."
        )
    else:
        how = "@pytest.mark.neuraldbg(baseline=True)" if marker else "a baseline"
        first = (
            f"NeuralDBG baseline: {nodeid} has {how} but watched no training run, so there is nothing to compare "
            "with a baseline or to store in one"
        )
        fix = (
            "Watch the training in the test (neuraldbg.smoke_train(...), or `with neuraldbg(model) as ndbg:` around "
            "the loop), or remove baseline=True from the tests that do not train."
        )
    return f"{first}\n\n{fix}"


def table(rows: Sequence[Row], *, change: bool = True) -> list[str]:
    """Aligned columns: metric, layer, point, baseline, now, tolerance and (with ``change``) what it means."""
    head = ["metric", "layer", "point", "baseline", "now", "tolerance", "change"]
    cells = [
        head,
        *(
            [inert(c) for c in (r.metric, r.layer or "-", r.point or "-", r.baseline, r.now, r.tolerance, r.change)]
            for r in rows
        ),
    ]
    if not change:
        cells = [c[:-1] for c in cells]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]


def regression_text(
    comparisons: Sequence[RunComparison],
    problems: Sequence[str],
    *,
    path: str,
    nodeid: str,
    hypotheses: Mapping[str, list[HypothesisRecord]],
    several: bool,
) -> str:
    """The failure text: one verdict line (the worst regression first), the file, then per run the regressions
    (the worst point of each metric and layer, worst first, the rest in one line) and, apart, what improved;
    then the engine's diagnosis and how to refresh."""
    problems = [inert(p) for p in problems]
    phrases = [*problems, *regression_lines(comparisons, several)]
    first = f"NeuralDBG baseline regression: {phrases[0]}"
    if len(phrases) > 1:
        first += f"; +{len(phrases) - 1} more"
    lines = [one_line(first, MAX_HEADLINE), "", f"Baseline: {inert(path)}"]
    lines += [f"  {p}" for p in problems]
    for c in comparisons:
        if not c.rows:
            continue
        lines += ["", f"run {inert(c.run)}:"] if several else []
        worst = c.worst_regressions
        if worst:
            shown = worst_per_group(worst)
            title = "Regressions beyond tolerance, worst first (the worst point of each metric and layer):"
            lines += [*([] if several else [""]), title, *table(shown[:MAX_ROWS], change=False)]
            rest = len(worst) - len(shown[:MAX_ROWS])
            if rest:
                groups = len(shown) - len(shown[:MAX_ROWS])
                where = f", {groups} more metrics and layers" if groups else ""
                lines.append(f"... and {rest} more points beyond tolerance{where}")
        better = grouped([r for r in c.rows if r.change == IMPROVED])
        if better:
            lines += ["", "Better than the baseline (these pass):", *(f"  {line}" for line in better)]
        changed = grouped([r for r in c.rows if r.change == CHANGED])
        if changed:
            lines += ["", "Changed together with a fixed failure (these pass):", *(f"  {line}" for line in changed)]
    for c in comparisons:
        found: list[HypothesisRecord] = [inert_data(h) for h in hypotheses.get(c.run) or []]
        if c.regressions and found:
            label = f" of run {inert(c.run)}" if several else ""
            lines += ["", headline(found, f"NeuralDBG's diagnosis{label}: training is unhealthy")]
            lines += [describe(h, i if len(found) > 1 else None) for i, h in enumerate(found, 1)]
    refresh = f"  {inert(update_command(nodeid))}"
    lines += ["", "If the change is intended, refresh the baseline and commit it:", refresh]
    return inert("\n".join(lines), lines=True)


def regression_lines(comparisons: Sequence[RunComparison], several: bool, *, per_group: bool = False) -> list[str]:
    """Every regression as a phrase, worst first within each run; with ``per_group`` only the worst point of
    each metric and layer (for the reports, which list what regressed rather than every point)."""
    return [
        inert(f"{in_run(c.run, several)}{r.what}")
        for c in comparisons
        for r in (worst_per_group(c.worst_regressions) if per_group else c.worst_regressions)
    ]


def grouped(rows: Sequence[Row]) -> list[str]:
    """One phrase per metric and layer (its first point, and how many more): verdicts, improved, changed."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.metric, row.layer, row.change), []).append(row)
    rank = {"verdict": 0, IMPROVED: 1, REGRESSED: 1, CHANGED: 2}
    ordered = sorted(groups.values(), key=lambda g: rank["verdict"] if g[0].metric == "verdict" else rank[g[0].change])
    more = {1: "", 2: " (+1 more point)"}
    return [inert(g[0].what) + more.get(len(g), f" (+{len(g) - 1} more points)") for g in ordered]


def in_run(run: str, several: bool) -> str:
    """``"run <name>: "`` before a phrase when the test has several runs, else nothing."""
    return f"run {inert(run)}: " if several else ""


def environment_text(path: str, differences: Sequence[str]) -> str:
    return inert(
        f"NeuralDBG baseline {path} was recorded in another environment ({'; '.join(differences)}); "
        f"training statistics may differ. Compared anyway; if this environment is the reference now, "
        f"refresh it with {UPDATE_FLAG}."
    )
