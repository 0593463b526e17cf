"""What a cheap step pays to keep its layers' outputs: the price of tracing a non-finite output to its layer.

    python -m benchmarks.layer_capture                       # tiny, MLP, transformer, deep; about 3 minutes
    python -m benchmarks.layer_capture --model deep --rounds 15 --block 40

On a cheap CPU step the module hook sits the model's call out and torch runs every layer on its fast path; the
debugger's wrapper of ``nn.Module.__call__`` still keeps each layer's output (one dictionary lookup, a few checks
and an append per layer call), so that an output found non-finite at the end of the pass is traced to the layer it
began in at that very step (see ``tests/engine/capture/test_unhooked_passes.py``). This measures what that keeping
costs, in the way of :mod:`benchmarks.overhead`: identical copies of each model train in alternating blocks, one
plain, one under the debugger as it is and one under the same debugger with the keeping left out
(:func:`without_capture`, an experiment of this benchmark only: the product never runs without it). The
difference of the two watched copies, over the plain copy's step, is the keeping's share of the step; divided by
the layer calls of a step, its price per layer call where it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook

from neuraldbg.capture import hooks

from .overhead import BY_NAME, Case, Runner, _fixture, load_average

#: The models measured by default: few layers and a cheap step, few layers and slow ones, many layers.
MODELS = ("tiny", "mlp", "transformer", "deep")


@contextmanager
def without_capture() -> Iterator[None]:
    """Debuggers attached inside keep no layer output on their cheap steps: their wrapper of
    ``nn.Module.__call__`` hands every call but a watched model's own straight to torch. Attach and close them
    inside (the wrapper is chosen when a debugger attaches, and put back when it closes)."""
    kept = hooks._watched_call

    def passing(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        root = hooks._roots.get(id(self))
        if root is None or root.ref() is not self or hooks._compiling():
            call = hooks._module_call[0] if hooks._module_call else hooks._torch_call
            return call(self, *args, **kwargs)
        return kept(self, *args, **kwargs)

    hooks._watched_call = passing
    try:
        yield
    finally:
        hooks._watched_call = kept


def layer_calls(case: Case) -> int:
    """How many module calls one forward pass of the model makes, its own included."""
    model = case.build()
    calls = [0]

    def count(module: torch.nn.Module, args: object, output: object) -> None:
        calls[0] += 1

    x, _ = case.batch(torch.Generator().manual_seed(0))
    handle = register_module_forward_hook(count)
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return calls[0]


def measure(case: Case, warmup: int, rounds: int) -> dict[str, float]:
    """Median ratios to the plain copy, round by round: ``"as is"`` and ``"without"`` (see the module); the plain
    copy's median step in seconds; the lowest and highest difference of the two ratios in one round."""
    state, batches = _fixture(case)
    runners = {
        name: Runner(case, state, None if name == "plain" else "default") for name in ("plain", "as is", "without")
    }

    def run(name: str, start: int, n: int) -> float:
        if name != "without":
            return runners[name].run(batches, start, n)
        with without_capture():
            return runners[name].run(batches, start, n)

    for name in runners:
        run(name, 0, warmup)
    times: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    step = warmup
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(run(name, step, case.block))
        step += case.block
    for runner in runners.values():
        runner.close()  # every step observed, or the figures are void
    plain = times["plain"]
    ratios = {name: [t / p for t, p in zip(times[name], plain, strict=True)] for name in ("as is", "without")}
    shares = [a - b for a, b in zip(ratios["as is"], ratios["without"], strict=True)]  # round by round
    return {name: statistics.median(r) for name, r in ratios.items()} | {
        "plain_step": statistics.median(plain),
        "share_low": min(shares),
        "share_high": max(shares),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", action="append", choices=sorted(BY_NAME), help="repeatable; default: " + ", ".join(MODELS)
    )
    parser.add_argument("--rounds", type=int, default=9, help="alternating blocks per copy (default 9)")
    parser.add_argument("--warmup", type=int, default=300, help="untimed steps first (default 300)")
    parser.add_argument(
        "--block", type=int, help="steps per block, each attached and closed (default: benchmarks.overhead's, 4-200)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        cases = [BY_NAME[name] for name in args.model or MODELS]
        if args.block:
            cases = [dataclasses.replace(case, block=args.block) for case in cases]
        results = {case.build.__name__: (measure(case, args.warmup, args.rounds), layer_calls(case)) for case in cases}
    finally:
        torch.set_num_threads(threads)
    print(f"torch {torch.__version__}, {args.threads} torch thread(s), {os.cpu_count()} CPUs, preset default")
    blocks = f"blocks of {args.block} steps" if args.block else "benchmarks.overhead's blocks"
    print(f"steady state, {args.rounds} rounds, {blocks}; ratios to the plain copy are medians over the rounds")
    print()
    print(
        "| model | module calls a step | plain step | as is | keeping no layer output | the keeping | its rounds "
        "| per layer call |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, (m, calls) in results.items():
        share = m["as is"] - m["without"]
        per_call = share * m["plain_step"] / max(calls - 1, 1) * 1e6  # the layers' calls: the model's own keeps nothing
        print(
            f"| {name} | {calls} | {m['plain_step'] * 1e3:.3f} ms | {m['as is']:.3f}x | {m['without']:.3f}x "
            f"| {share:+.3f} | {m['share_low']:+.3f} to {m['share_high']:+.3f} | {per_call:+.2f} us |"
        )
    print()
    print(f"load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
