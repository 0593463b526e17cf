"""This checkout's overhead next to an earlier revision's, side by side in one process.

    python -m benchmarks.against 9b93c58                  # tiny, MLP, CNN, transformer, deep
    python -m benchmarks.against 9b93c58 --model deep

The package of REVISION (``git archive``) is imported next to this checkout's as ``ndbg_base`` (its imports are
relative). For each model, fresh copies (same initial weights, same batches, one torch thread) train 50 steps: a
plain one, then, in rotating order, the old and the new package under the default and the full preset; every
watched copy's final parameters must equal the plain copy's bit for bit. Ratios are a watched run's thread CPU
time over the plain run of the same repeat (attach and close included, ``hypotheses()`` not), median over
repeats. A steady-state pair follows: after 100 untimed steps, blocks of each copy alternate (default preset,
attached for its own blocks only; attaching and removing the hooks are not timed, the commit and flush of each
block's last step are), median of the block ratios. Last, the analysis of a
fully observed step alone (:func:`analysis`): milliseconds per step, old and new, over the same training's
records; both must find the same events.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import neuraldbg

from .overhead import CASES, Case, _fixture, finish_steps

REPEATS = {"tiny": 30, "mlp": 6, "cnn": 4, "transformer": 6, "deep": 8}


def _copy(case: Case, state: dict[str, torch.Tensor]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A fresh copy of the case's model at the shared initial weights, with its optimizer."""
    model = case.build()
    model.load_state_dict(state)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def _loop(case: Case, model: torch.nn.Module, opt: torch.optim.Optimizer, batches: list[Any]) -> None:
    """The 50 training steps every measurement here runs, dropout seeded alike in every copy."""
    torch.manual_seed(1)
    for i in range(50):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        case.loss(model(x), y).backward()
        opt.step()


def _train(
    case: Case, state: dict[str, torch.Tensor], batches: list[Any], pkg: ModuleType | None, preset: str
) -> tuple[float, list[torch.Tensor]]:
    model, opt = _copy(case, state)
    dbg = pkg.NeuralDbg(model, preset=preset) if pkg else None
    t0 = time.thread_time()
    if dbg:
        dbg.attach()
    _loop(case, model, opt, batches)
    if dbg:
        dbg.close()
    return time.thread_time() - t0, [p.detach().clone() for p in model.parameters()]


def first50(case: Case, base: ModuleType) -> dict[str, float]:
    state, batches = _fixture(case)
    variants = [
        ("old", base, "default"),
        ("new", neuraldbg, "default"),
        ("old full", base, "full"),
        ("new full", neuraldbg, "full"),
    ]
    ratios: dict[str, list[float]] = {v[0]: [] for v in variants}
    for r in range(REPEATS[case.build.__name__]):
        plain, reference = _train(case, state, batches, None, "")
        for name, pkg, preset in variants[r % 4 :] + variants[: r % 4]:
            t, params = _train(case, state, batches, pkg, preset)
            if not all(torch.equal(a, b) for a, b in zip(reference, params, strict=True)):
                raise AssertionError(f"{name}: the watched training differs from the plain one")
            ratios[name].append(t / plain)
    return {k: statistics.median(v) for k, v in ratios.items()}


def steady(case: Case, base: ModuleType, rounds: int = 20) -> dict[str, float]:
    state, batches = _fixture(case)
    copies = []
    for pkg in (None, base, neuraldbg):
        model = case.build()
        model.load_state_dict(state)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        copies.append((model, opt, pkg.NeuralDbg(model) if pkg else None))

    def block(copy: Any, start: int, n: int) -> float:
        model, opt, dbg = copy
        if dbg:
            dbg.attach()  # not timed: a run attaches once (see benchmarks.overhead's Runner.run)
        t0 = time.thread_time()
        for i in range(start, start + n):
            x, y = batches[i % len(batches)]
            opt.zero_grad(set_to_none=True)
            case.loss(model(x), y).backward()
            opt.step()
        if dbg:
            finish_steps(dbg)  # timed
        seconds = (time.thread_time() - t0) / n
        if dbg:
            dbg.close()  # not timed: the hooks removed, once per run like attaching
        return seconds

    for c in copies:
        block(c, 0, 100)
    times: list[list[float]] = [[], [], []]
    step = 100
    for r in range(rounds):
        for k in [(r + j) % 3 for j in range(3)]:
            times[k].append(block(copies[k], step, case.block))
        step += case.block
    return {
        name: statistics.median(t / p for t, p in zip(times[k], times[0], strict=True))
        for k, name in ((1, "old"), (2, "new"))
    }


def analysis(case: Case, base: ModuleType, repeats: int = 7) -> dict[str, float]:
    """Milliseconds of analysis (detectors, tracker, history) per fully observed step, old and new. Each package's
    debugger trains a fresh copy 50 steps under the full preset, its records kept as they reach the analysis; then,
    alternating, a fresh debugger of each package (never attached) analyses a copy of its own records, timed alone
    (thread CPU time), median over repeats. The training is left out of the timing: what a change to the analysis
    saves shows here even when the whole run's ratios move less than their noise."""
    state, batches = _fixture(case)
    runs: dict[str, tuple[ModuleType, torch.nn.Module, list[Any], list[Any]]] = {}
    for name, pkg in (("old", base), ("new", neuraldbg)):
        model, opt = _copy(case, state)
        dbg = pkg.NeuralDbg(model, preset="full")
        records: list[Any] = []
        sink = dbg._recorder._sink

        def keep(batch: Any, sink: Any = sink, records: list[Any] = records) -> Any:
            records.extend(copy.deepcopy(list(batch)))
            return sink(batch)

        dbg._recorder._sink = keep
        with dbg:
            _loop(case, model, opt, batches)
        runs[name] = (pkg, model, list(dbg._analyzer.ctx.order), records)
    times: dict[str, list[float]] = {"old": [], "new": []}
    found: dict[str, list[tuple[Any, ...]]] = {}
    for r in range(repeats):
        for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
            pkg, model, order, records = runs[name]
            analyzer = pkg.NeuralDbg(model, preset="full")._analyzer
            analyzer.ctx.order.extend(order)
            fresh = copy.deepcopy(records)
            t0 = time.thread_time()
            for record in fresh:
                analyzer.consume([record])
            times[name].append((time.thread_time() - t0) / max(1, sum(record.full for record in fresh)))
            found[name] = [(str(e.kind), e.layer, e.step_start, e.step_end) for e in analyzer.events(final=True)]
    if found["old"] != found["new"]:
        raise AssertionError(f"{case.build.__name__}: the analyses found different events")
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def load_base(revision: str, folder: Path) -> ModuleType:
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "archive", revision, "neuraldbg"], cwd=root, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    (folder / "neuraldbg").rename(folder / "ndbg_base")
    sys.path.insert(0, str(folder))
    return importlib.import_module("ndbg_base")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="the git revision to compare with")
    parser.add_argument("--model", choices=list(REPEATS), action="append", help="only these models")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        base = load_base(args.revision, Path(tmp))
        print(f"{args.revision} (old) vs this checkout (new), 1 thread, load average {os.getloadavg()[0]:.1f}")
        print()
        print(
            "| model | first 50, old | new | full preset first 50, old | new | steady, old | new"
            " | analysis per full step, old | new |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for case in CASES:
            short = case.build.__name__
            if args.model and short not in args.model:
                continue
            f, s, a = first50(case, base), steady(case, base), analysis(case, base)
            print(
                f"| {short} | {f['old']:.2f}x | {f['new']:.2f}x | {f['old full']:.2f}x | {f['new full']:.2f}x |"
                f" {s['old']:.2f}x | {s['new']:.2f}x | {a['old']:.2f} ms | {a['new']:.2f} ms |",
                flush=True,
            )
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
