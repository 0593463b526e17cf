"""Where a watched step's time goes: each of the debugger's callbacks timed inside the training loop.

    python -m benchmarks.step_parts                  # the tiny model, 5,000 steady steps
    python -m benchmarks.step_parts --model deep --steps 200
    python -m benchmarks.step_parts --model deep --preset full --steps 100 --warmup 50 --rounds 3   # full steps

A torch operation issued from a hook costs several times what it costs in a hot microbenchmark (the caches are
cold after the user's own step), so the parts are timed where they run: each callback of the recorder is wrapped
with a timer for the measured steps only, and its time per step is printed with the plain step's and the watched
step's (the wrappers add well under a microsecond per call). A callback's time includes the callbacks it calls
(the forward hook's includes committing the last step and the flush). Each phase of the step (zero_grad, forward,
loss, backward, optimizer step) is timed too, in the plain copy and the watched one alike. The timers are removed
afterwards; the training itself is the same as ``benchmarks.overhead``'s (its models, batches and optimizer).
"""

from __future__ import annotations

import argparse
import functools
import gc
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from neuraldbg import NeuralDbg
from neuraldbg.analysis.analyzer import Analyzer
from neuraldbg.capture.backward import BackwardPath
from neuraldbg.capture.forward import ForwardPath
from neuraldbg.capture.gradients import GradientReader
from neuraldbg.capture.ledger import GradLedger
from neuraldbg.capture.recorder import Recorder
from neuraldbg.stats import tensors

from .overhead import BY_NAME, Case, _fixture

#: (label, class or module, function): what is timed, in the order printed. Nested parts are indented under their
#: caller; a function of a module is timed wherever it is called from (its callers look it up on the module).
PARTS: list[tuple[str, Any, str]] = [
    ("the model's call begins (opens the pass)", ForwardPath, "on_model_call"),
    ("  commit of the last step", Recorder, "commit"),
    ("    flush", Recorder, "flush"),
    ("      analysis of the flushed records", Analyzer, "consume"),
    ("forward hook (hooked passes: every module call)", ForwardPath, "on_module_output"),
    ("the model's call returns (unhooked passes)", ForwardPath, "on_model_end"),
    ("  end of the model's forward (either way)", ForwardPath, "_end"),
    ("    the output's cheap check", ForwardPath, "_check_ends"),
    ("      its norm and read (host_norm, from every caller)", tensors, "host_norm"),
    ("optimizer pre-hook", BackwardPath, "on_optimizer_step"),
    ("  finite check of the gradients", GradientReader, "check_finite"),
    ("    their copy, sum and read (surely_finite)", tensors, "surely_finite"),
    ("  head-gradient probe", GradientReader, "read_head"),
    ("  full-step gradient statistics", GradientReader, "capture"),
    ("optimizer post-hook", BackwardPath, "on_optimizer_stepped"),
    ("backward listener, before the pass", GradLedger, "before"),
    ("backward listener, after the pass", GradLedger, "_after"),
]


@contextmanager
def timers(totals: dict[str, int]) -> Iterator[None]:
    """Wrap every part of :data:`PARTS` with a timer adding nanoseconds to ``totals``; unwrap on exit."""
    saved: list[tuple[Any, str, Any]] = []

    def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[label] = totals.get(label, 0) + time.perf_counter_ns() - start

        return wrapper

    try:
        for label, cls, name in PARTS:
            original = cls.__dict__[name]
            saved.append((cls, name, original))
            setattr(cls, name, timed(label, original))
        yield
    finally:
        for cls, name, original in saved:
            setattr(cls, name, original)


#: The phases of a training step, timed in the plain and in the watched copy alike.
PHASES = ("zero_grad", "forward", "loss", "backward", "optimizer step")


def _train(case: Case, model: torch.nn.Module, batches: list[Any], phases: dict[str, int]) -> Callable[[int], None]:
    """One step of ``model``, each of its :data:`PHASES` adding its nanoseconds to ``phases``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)  # as benchmarks.overhead trains
    clock = time.perf_counter_ns

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        t0 = clock()
        optimizer.zero_grad()
        t1 = clock()
        out = model(x)
        t2 = clock()
        loss = case.loss(out, y)
        t3 = clock()
        loss.backward()
        t4 = clock()
        optimizer.step()
        t5 = clock()
        for name, took in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            phases[name] = phases.get(name, 0) + took

    return step


def per_step(step: Callable[[int], None], start: int, n: int, faults: list[float]) -> float:
    """Microseconds per step of ``n`` steps; the process's minor page faults per step appended to ``faults`` (memory
    the allocator gave back to the system and took again: a step's tensors that outlive it can make it do so)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    begin = time.perf_counter()
    for i in range(start, start + n):
        step(i)
    took = (time.perf_counter() - begin) / n * 1e6
    faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n)
    return took


@dataclass
class Measured:
    """Medians over the rounds, in microseconds per step."""

    plain: float
    watched: float
    parts: dict[str, float]  # each of :data:`PARTS`, watched copy
    plain_phases: dict[str, float]  # each of :data:`PHASES`
    watched_phases: dict[str, float]
    plain_faults: float  # minor page faults per step
    watched_faults: float


def measure(
    case: Case, steps: int, warmup: int, rounds: int, collector: bool = True, preset: str = "default"
) -> Measured:
    """``collector=False``: Python's garbage collector off during the timed blocks of both copies (what its
    collections cost the watched step, whose records live until their flush). ``preset``: the debugger's
    (``"full"``: every step fully observed, what the first steps of a run cost)."""
    state, batches = _fixture(case)
    plain, watched = case.build(), case.build()
    plain.load_state_dict(state)
    watched.load_state_dict(state)
    plain_times: dict[str, int] = {}
    watched_times: dict[str, int] = {}
    plain_step = _train(case, plain, batches, plain_times)
    watched_step = _train(case, watched, batches, watched_times)
    plain_phases: dict[str, list[float]] = {}
    watched_phases: dict[str, list[float]] = {}
    # the recorder binds its hooks when the debugger is made: the classes are wrapped first, so the bound ones time
    parts: dict[str, list[float]] = {}
    plains: list[float] = []
    watches: list[float] = []
    faults: tuple[list[float], list[float]] = ([], [])
    totals: dict[str, int] = {}
    with timers(totals):
        dbg = NeuralDbg(watched, preset=preset).attach()
        for i in range(warmup):
            watched_step(i)
        dbg.close()  # attached for its own blocks only: its hooks are global (``attach()`` continues the run)
        for i in range(warmup):
            plain_step(i)  # warmed alike (optimizer state allocated, caches filled) before anything is timed
        at = warmup
        for _ in range(rounds):
            plain_times.clear()
            with _collector(collector):
                plains.append(per_step(plain_step, at, steps, faults[0]))
            dbg.attach()
            gc.collect()
            totals.clear()
            watched_times.clear()
            with _collector(collector):
                watches.append(per_step(watched_step, at, steps, faults[1]))
            for label, ns in totals.items():
                parts.setdefault(label, []).append(ns / steps / 1e3)
            for times, into in ((plain_times, plain_phases), (watched_times, watched_phases)):
                for name, ns in times.items():
                    into.setdefault(name, []).append(ns / steps / 1e3)
            dbg.close()
            at += steps
    return Measured(
        statistics.median(plains),
        statistics.median(watches),
        _medians(parts),
        _medians(plain_phases),
        _medians(watched_phases),
        statistics.median(faults[0]),
        statistics.median(faults[1]),
    )


@contextmanager
def _collector(on: bool) -> Iterator[None]:
    was = gc.isenabled()
    if not on:
        gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _medians(values: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in values.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(BY_NAME), default="tiny")
    parser.add_argument("--steps", type=int, default=1000, help="steps per timed block (default 1000)")
    parser.add_argument("--warmup", type=int, default=1000, help="untimed steps first: the steady state")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-gc", action="store_true", help="the garbage collector off in the timed blocks")
    parser.add_argument("--preset", choices=["default", "economy", "full"], default="default")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    case = BY_NAME[args.model]
    m = measure(case, args.steps, args.warmup, args.rounds, collector=not args.no_gc, preset=args.preset)
    setting = f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds of {args.steps} steps"
    setting += f", preset {args.preset}"
    setting += ", garbage collector off" if args.no_gc else ""
    print(f"{case.name}: {setting}")
    print(f"plain step {m.plain:.1f} us, watched {m.watched:.1f} us ({m.watched / m.plain:.2f}x)")
    print(f"minor page faults per step: plain {m.plain_faults:.1f}, watched {m.watched_faults:.1f}\n")
    print("| phase of the step | plain us | watched us | added |\n|---|---|---|---|")
    for name in PHASES:
        p, w = m.plain_phases.get(name, 0.0), m.watched_phases.get(name, 0.0)
        print(f"| {name} | {p:.1f} | {w:.1f} | {w - p:+.1f} |")
    print("\n| part (inside the loop) | us per step |\n|---|---|")
    for label, _, _ in PARTS:
        if label in m.parts:
            depth = (len(label) - len(label.lstrip())) // 2
            print(f"| {'... ' * depth}{label.strip()} | {m.parts[label]:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
