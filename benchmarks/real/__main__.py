"""Command line of the real-programs benchmark.

python -m benchmarks.real [--family F] [--case ID] [--jobs N] [--json PATH] [--observe-loss]
    every selected case under NeuralDBG, scored against benchmarks/real/ground_truth.json: the loops as users
    write them, with no call to NeuralDBG inside (the loss is recorded from the backward pass); --observe-loss
    hands each step's loss to dbg.observe_loss as well
python -m benchmarks.real --ground-truth [--write] [--family F] [--case ID] [--jobs N]
    recompute the ground truth with plain torch; check it agrees with the stored one (exit 1 if not),
    or store it (--write)
python -m benchmarks.real --score RUN.json
    the table and the wrong answers of a run saved with --json, scored again against the stored ground truth
python -m benchmarks.real --details RUN.json
    the plain-torch evidence and NeuralDBG's words for every wrong answer of such a run (Markdown)
python -m benchmarks.real --list
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from . import details, score
from .core import HEALTHY, Case
from .programs import cases
from .runner import neuraldbg_task, plain_task, run_all
from .truth import SEEDS, decide, learns, runs_of

TRUTH = Path(__file__).with_name("ground_truth.json")


def select(families: list[str], ids: list[str]) -> list[Case]:
    chosen = [c for c in cases() if (not families or c.family in families) and (not ids or c.id in ids)]
    unknown = set(ids) - {c.id for c in cases()}
    if unknown:
        sys.exit(f"unknown cases: {', '.join(sorted(unknown))} (see --list)")
    if not chosen:
        sys.exit("no case selected (see --list)")
    return chosen


def load_truth() -> dict[str, dict[str, Any]]:
    if not TRUTH.exists():
        sys.exit(f"{TRUTH} is missing: run python -m benchmarks.real --ground-truth --write")
    return json.loads(TRUTH.read_text())["cases"]


# --- ground truth ----------------------------------------------------------------------------------------


def ground_truth(chosen: list[Case], jobs: int, write: bool) -> int:
    twins = {c.program.name: Case(c.program, c.program.variants[0]) for c in chosen}
    needed = {c.id: c for c in [*twins.values(), *chosen]}
    tasks = [(c.id, seed, probe) for c in needed.values() for (_, seed, probe) in runs_of(c)]
    start = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {cid: [] for cid in needed}
    for (cid, _seed, _probe), result in zip(tasks, run_all(plain_task, tasks, jobs)):
        runs[cid].append(result)
        if len(runs[cid]) == len(SEEDS):
            print(f"  {cid}: {[round(r['metric'], 4) for r in runs[cid]]}", file=sys.stderr, flush=True)
    entries = {c.id: decide(c, runs[c.id], runs[twins[c.program.name].id]) for c in chosen}
    print(f"ground truth of {len(entries)} cases in {time.perf_counter() - start:.0f} s")
    for e in entries.values():
        if e["variant"] == HEALTHY and not learns(e):
            print(f"WARNING {e['id']}: the healthy program does not clearly beat chance")
    for e in entries.values():
        label = "harmful " if e["harmful"] else "harmless"
        ev = e["evidence"]
        print(
            f"{label} {e['id']:<40} {ev['metric_name']} {ev['metric_mean']:.4g} (twin {ev['twin_mean']:.4g} "
            f"margin {ev['margin']:.3g}) {'; '.join(e['reasons'])}"
        )
    if write:
        stored = json.loads(TRUTH.read_text())["cases"] if TRUTH.exists() else {}
        stored.update(entries)
        order = [c.id for c in cases() if c.id in stored]
        TRUTH.write_text(
            json.dumps({"seeds": list(SEEDS), "cases": {cid: stored[cid] for cid in order}}, indent=1) + "\n"
        )
        print(f"wrote {TRUTH}")
        return 0
    return compare(entries, load_truth())


def compare(entries: dict[str, dict[str, Any]], stored: dict[str, dict[str, Any]]) -> int:
    disagreements = 0
    for cid, new in entries.items():
        old = stored.get(cid)
        if old is None:
            print(f"NOT STORED  {cid}")
            disagreements += 1
            continue
        for key in ("harmful", "kinds", "root"):
            if new[key] != old[key]:
                print(f"DISAGREES   {cid}: {key} {old[key]!r} stored, {new[key]!r} now")
                disagreements += 1
        drift = [(a, b) for a, b in zip(new["evidence"]["metric"], old["evidence"]["metric"]) if not _close(a, b)]
        if drift:
            was, now = old["evidence"]["metric"], new["evidence"]["metric"]
            print(f"DRIFT       {cid}: metric per seed {was} stored, {now} now")
    print(f"{len(entries) - disagreements}/{len(entries)} cases agree with {TRUTH.name}")
    return 1 if disagreements else 0


def _close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


# --- under NeuralDBG -------------------------------------------------------------------------------------


def benchmark(chosen: list[Case], jobs: int, observe_loss: bool, json_path: str | None) -> int:
    truth = load_truth()
    missing = [c.id for c in chosen if c.id not in truth]
    if missing:
        sys.exit(f"no ground truth for {', '.join(missing)}: run --ground-truth --write first")
    start = time.perf_counter()
    results = []
    for result in run_all(neuraldbg_task, [(c.id, observe_loss) for c in chosen], jobs):
        top = result["hypotheses"][0]["summary"] if result["hypotheses"] else "healthy"
        print(f"  {result['id']:<40} {result['seconds']:6.1f} s  {top}", file=sys.stderr, flush=True)
        results.append(result)
    wall = time.perf_counter() - start
    # a metric other than the stored plain run's: the same seed trained plain here says whether NeuralDBG or this
    # machine's arithmetic made the difference
    differing = [(r["id"], 0, False) for r in results if not r["error"] and score.differs(truth, r)]
    local = {cid: plain["metric"] for (cid, _, _), plain in zip(differing, run_all(plain_task, differing, jobs))}
    scored = report(truth, results, wall, jobs, local)
    if json_path:
        run = {"observe_loss": observe_loss, "wall": wall, "jobs": jobs, "score": scored, "results": results}
        Path(json_path).write_text(json.dumps(run, indent=1) + "\n")
    return 0


def report(
    truth: dict[str, dict[str, Any]],
    results: list[dict[str, Any]],
    wall: float,
    jobs: int,
    local: dict[str, float] | None = None,
) -> dict[str, Any]:
    scored = score.score(truth, results)
    print(score.table(scored, wall, sum(r["seconds"] for r in results), jobs))
    print()
    for line in score.wrong_lines(truth, results, scored) + score.same_run_lines(truth, results, local):
        print(line)
    return scored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.real", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--family", action="append", default=[], help="only this family (repeatable)")
    parser.add_argument("--case", action="append", default=[], help="only this case id (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--json", help="write every answer and the scores to this file")
    parser.add_argument(
        "--observe-loss", action="store_true", help="also hand each step's loss to dbg.observe_loss(loss)"
    )
    parser.add_argument("--ground-truth", action="store_true", help="recompute the ground truth with plain torch")
    parser.add_argument("--write", action="store_true", help="with --ground-truth: store it")
    parser.add_argument("--list", action="store_true", help="list the cases")
    parser.add_argument("--details", metavar="RUN.json", help="the evidence behind each wrong answer of a run")
    parser.add_argument("--score", metavar="RUN.json", help="score a run saved with --json again (same table)")
    args = parser.parse_args(argv)
    if args.details:
        print(details.details(load_truth(), args.details))
        return 0
    if args.score:
        run = json.loads(Path(args.score).read_text())
        report(load_truth(), run["results"], run.get("wall", math.nan), run.get("jobs", 0))
        return 0
    if args.list:
        for c in cases():
            print(f"{c.family:<22} {c.id:<40} {c.variant.operator:<20} {c.variant.description}")
        return 0
    chosen = select(args.family, args.case)
    if args.ground_truth:
        return ground_truth(chosen, args.jobs, args.write)
    return benchmark(chosen, args.jobs, args.observe_loss, args.json)


if __name__ == "__main__":
    sys.exit(main())
