"""Python's garbage collector over a run's first steps: its collections by generation and its time, plain and watched.

    python -m benchmarks.collector                           # the 5,000 tensors' first 64 steps, the deep MLP's 50
    python -m benchmarks.collector --model deep --preset full

A full collection (the oldest generation) walks every tracked object of the process, about 440,000 in this
benchmark's process once the 5,000-tensor model is built; young ones walk what was made since the last. The
debugger's short-lived objects, made inside its own calls, set off collections a plain run does not make
(see :mod:`neuraldbg.capture.collector`, which keeps automatic collection out of those calls). For each model a
plain copy trains the first steps, then a fresh watched copy the same steps (same weights and batches as
``benchmarks.overhead``), each after a ``gc.collect()``; ``gc.callbacks`` counts the collections of each generation
and times them. The counts depend on what the process holds, so compare runs of one command, on one machine; the
times are the shared machine's.
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass, field

import torch

from .overhead import BY_NAME, Case, Runner, _fixture


@dataclass
class Collected:
    """What the collector did while one copy trained: collections per generation (0, 1, 2) and their seconds."""

    counts: list[int] = field(default_factory=lambda: [0, 0, 0])
    seconds: float = 0.0
    run_seconds: float = 0.0


class _Counter:
    """A ``gc.callbacks`` entry counting and timing collections while installed."""

    def __init__(self) -> None:
        self.collected = Collected()
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        self.collected.seconds += time.perf_counter() - self._began
        self.collected.counts[info["generation"]] += 1


def count(case: Case, steps: int, preset: str | None) -> Collected:
    """Train a fresh copy of ``case`` for ``steps`` steps, watched with ``preset`` (None: plain), closed after; the
    collector's work meanwhile. Collection is switched on for the run and left as it was."""
    state, batches = _fixture(case)
    runner = Runner(case, state, preset)
    counter = _Counter()
    was = gc.isenabled()
    gc.enable()
    gc.collect()
    gc.callbacks.append(counter)
    try:
        began = time.perf_counter()
        runner.run(batches, 0, steps)  # attached before and closed after, when watched
        counter.collected.run_seconds = time.perf_counter() - began
    finally:
        gc.callbacks.remove(counter)
        if not was:
            gc.disable()
    runner.close()  # raises when the debugger did not observe every step: the figures would be void
    return counter.collected


def row(name: str, steps: int, preset: str, plain: Collected, watched: Collected) -> str:
    def cell(c: Collected) -> str:
        gens = " / ".join(f"{n:,}" for n in c.counts)
        return f"{gens} | {c.seconds * 1e3:,.0f} ms of {c.run_seconds:,.1f} s"

    return f"| {name}, first {steps} steps, {preset} | {cell(plain)} | {cell(watched)} |"


HEADER = [
    "| run | plain: collections (generations 0 / 1 / 2) | plain: collector time | "
    "watched: collections | watched: collector time |",
    "|---|---|---|---|---|",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(BY_NAME), action="append", help="repeatable (default: many, deep)")
    parser.add_argument("--steps", type=int, help="steps per run (default: the model's first steps, 50 or 64)")
    parser.add_argument("--preset", choices=["default", "economy", "full"], default="default")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} torch thread(s), preset {args.preset}\n")
    print("\n".join(HEADER))
    for name in args.model or ["many", "deep"]:
        case = BY_NAME[name]
        steps = args.steps or case.first
        plain = count(case, steps, None)
        watched = count(case, steps, args.preset)
        print(row(name, steps, args.preset, plain, watched), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
