"""What one small tensor operation costs where the debugger's cheap checks run: inside a training step's hooks.

    python -m benchmarks.cold_ops                       # tiny, MLP, transformer, deep; about a minute
    python -m benchmarks.cold_ops --model transformer --steps 400

A cheap step's own work is a handful of small reads (a 0-d reading, the output's norm, one element of a gradient,
a sum over the gradients), each a few microseconds in a hot loop. Where they run, right after the model's forward
or backward pass or as the optimizer step begins, the caches hold the training's own code and data, and the first
call of each kind of operation pays for bringing its code back. This measures that, with no debugger attached: a
plain copy of each model of :mod:`benchmarks.overhead` trains as it does there, and an optimizer step pre-hook of
its own calls one operation of :data:`OPS` twice per step (a different one each step, in turn) on a small tensor
made before training, timing the first call and the second. The same operation timed in a hot loop beside the
training is the third figure. What the first call costs over the second is the price of running at that moment,
paid once per kind of operation per step, whatever the operation computes: a cheap step costs at least its
number of distinct operations times that price.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

from .overhead import BY_NAME, _fixture, load_average

_PROBE = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
_SCALAR = _PROBE.sum()
_VALUES = [float(i) for i in range(64)]

#: (label, operation): what a cheap step does, each on a tensor made once.
OPS: list[tuple[str, Callable[[], object]]] = [
    ("Python only: the sum of 64 floats in a list", lambda: sum(_VALUES)),
    ("a 0-d reading: float(t)", lambda: float(_SCALAR)),
    ("a 0-d reading: t.tolist()", lambda: _SCALAR.tolist()),
    ("a 0-d reading: t.item()", lambda: _SCALAR.item()),
    ("one element: float(t.reshape(-1)[i])", lambda: float(_PROBE.reshape(-1)[7])),
    ("a norm read: float(vector_norm(t))", lambda: float(torch.linalg.vector_norm(_PROBE))),
    ("a sum read: float(t.sum())", lambda: float(_PROBE.sum())),
]
#: The models measured by default: a step of 0.25 ms, then steps of milliseconds with few and with many layers.
MODELS = ("tiny", "mlp", "transformer", "deep")


def measure(name: str, steps: int, warmup: int) -> dict[str, tuple[float, float, float]]:
    """For each of :data:`OPS`: microseconds of its first call in the optimizer step's pre-hook, of its second call
    there, and in a hot loop (medians)."""
    case = BY_NAME[name]
    state, batches = _fixture(case)
    model = case.build()
    model.load_state_dict(state)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)  # as benchmarks.overhead trains
    first: dict[str, list[float]] = {label: [] for label, _ in OPS}
    again: dict[str, list[float]] = {label: [] for label, _ in OPS}
    turn = [0]
    clock = time.perf_counter_ns

    def probe(opt: object, args: object, kwargs: object) -> None:
        label, op = OPS[turn[0] % len(OPS)]
        turn[0] += 1
        t0 = clock()
        op()
        t1 = clock()
        op()
        t2 = clock()
        if turn[0] > warmup:
            first[label].append((t1 - t0) / 1e3)
            again[label].append((t2 - t1) / 1e3)

    handle = optimizer.register_step_pre_hook(probe)
    try:
        for i in range(warmup + steps):
            x, y = batches[i % len(batches)]
            optimizer.zero_grad()
            case.loss(model(x), y).backward()
            optimizer.step()
    finally:
        handle.remove()
    out: dict[str, tuple[float, float, float]] = {}
    for label, op in OPS:
        for _ in range(100):
            op()
        t0 = clock()
        for _ in range(1000):
            op()
        hot = (clock() - t0) / 1000 / 1e3
        out[label] = (statistics.median(first[label]), statistics.median(again[label]), hot)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", action="append", choices=sorted(BY_NAME), help="repeatable; default: " + ", ".join(MODELS)
    )
    parser.add_argument("--steps", type=int, default=250, help="probed steps per model, the operations taking turns")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        results = {name: measure(name, args.steps, args.warmup) for name in args.model or MODELS}
    finally:
        torch.set_num_threads(threads)
    print(f"torch {torch.__version__}, {args.threads} torch thread(s), {os.cpu_count()} CPUs, microseconds, medians")
    print()
    print("| operation | " + " | ".join(f"{name}: first / again" for name in results) + " | hot loop |")
    print("|---|" + "---|" * (len(results) + 1))
    for label, _ in OPS:
        cells = [f"{r[label][0]:.1f} / {r[label][1]:.1f}" for r in results.values()]
        hot = statistics.median(r[label][2] for r in results.values())
        print(f"| {label} | " + " | ".join(cells) + f" | {hot:.1f} |")
    print()
    print(f"load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
