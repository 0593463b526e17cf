"""Where a smoke test's time goes: each step of the smoke file's runs, watched against plain, and the fixed costs.

    python -m benchmarks.smoke_steps              # 15 runs of each model (about 10 s on 2 cores)
    python -m benchmarks.smoke_steps --runs 5 --model mlp

The models, batches and optimizer are the smoke file's (:mod:`benchmarks.smoke_file`: the 32-64-64-10 MLP and the
small CNN, Adam at 1e-3, 50 steps): each run trains a fresh copy in a loop like the fixture's ``smoke_train``
(``zero_grad``, forward, loss, ``observe_loss``, ``backward``, ``step``), alternately plain and under a fresh
debugger, one torch thread. Every step is timed. A step's added time is the median over runs of the watched step's
time less the plain one's; steps are grouped by what the debugger does on them: fully observed steps, the cheap
step right after one (it commits the fully observed step and analyses it), and the other cheap steps. The fixed
costs of a test are timed apart: making the debugger, entering its ``with`` block, leaving it (the last step is
committed and analysed there) and the first ``explain_failure()``. A second table splits each group's average
step into its phases (``zero_grad``, forward, loss, ``observe_loss``, backward, optimizer step): a fully observed
step's analysis, for one, is paid in the next step's forward, when that step's first call commits it. Which steps
were fully observed is read from the records the debugger analysed, so the grouping is the debugger's own, not
assumed from its schedule.

Where :mod:`benchmarks.smoke_file` gives the whole test's ratio, this says which part of it to work on.

``--count`` prints what a run does instead of how long it takes: the Python function calls (builtins included;
of them, the functions written in Python, each of which runs a frame: the costly ones) and the aten operations of
one plain and one watched run of each model, and the debugger's calls by where they begin (the analysis of
committed steps, or the hook or method the loop reached first). These are exact, not timed: the same code gives
the same figures at any load, so a change that trims the debugger's Python shows there even when it is smaller
than the timing noise.

    python -m benchmarks.smoke_steps --count

``--inside`` splits each group's added time in two: the time spent inside the debugger's entry points (its module
hook, the model-call callbacks, the backward-call listener and what it returns, the gradient hooks, the optimizer's
step hooks, ``observe_loss``), timed by a clock around each outermost entry, and the rest: the wrappers of
``nn.Module.__call__`` and ``backward`` and the training's own work, which runs slower beside the debugger's because
the debugger's code and data evict the training's from the CPU's caches. The same work costs more in a step than
it does alone in a loop, and this measures by how much.

    python -m benchmarks.smoke_steps --inside
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import itertools
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from neuraldbg import NeuralDbg

from .overhead import load_average
from .smoke_file import COMMON

STEPS = 50
#: The phases of a step, each timed (a step's time is their sum).
PHASES = ("zero_grad", "forward", "loss", "observe_loss", "backward", "step")
#: The fixed costs of a watched test, in the order printed.
FIXED = ("make the debugger", "enter its block", "leave it", "first explain_failure()")


def smoke_models() -> dict[str, Any]:
    """The smoke file's ``mlp``, ``cnn`` and ``batches`` (its shared module's source, run here)."""
    namespace: dict[str, Any] = {}
    exec(compile(COMMON, "smoke_common", "exec"), namespace)  # the benchmark's own source text
    return namespace


@dataclass
class Run:
    steps: list[int]  # nanoseconds of each step
    phases: list[list[int]] = field(default_factory=list)  # nanoseconds of each of PHASES, for each step
    fixed: dict[str, int] = field(default_factory=dict)  # nanoseconds of each of FIXED (watched runs only)
    full: dict[int, bool] = field(default_factory=dict)  # each analysed step: fully observed or not
    inside: list[int] = field(default_factory=list)  # nanoseconds of each step inside the debugger (see timed_entries)
    debugger: NeuralDbg | None = None


#: The debugger's entry points during a step, as ``(module, class, method)``: every call the training makes into it
#: between a step's start and its end begins in one of them (the wrappers of ``nn.Module.__call__`` and ``backward``
#: pass through to these, and are not counted in them).
ENTRIES = (
    ("neuraldbg.capture.forward", "ForwardPath", ("on_model_call", "on_model_end", "on_module_output")),
    (
        "neuraldbg.capture.backward",
        "BackwardPath",
        ("on_backward_start", "on_output_gradient", "_on_backward_end", "on_optimizer_step", "on_optimizer_stepped"),
    ),
    ("neuraldbg.capture.ledger", "GradLedger", ("before", "_after")),
    ("neuraldbg.capture.recorder", "Recorder", ("observe_loss",)),
)


@contextlib.contextmanager
def timed_entries(total: list[int]) -> Iterator[None]:
    """While open, add to ``total[0]`` the nanoseconds spent in the outermost calls of :data:`ENTRIES` (a call made
    inside another, the commit inside the model call's start, counts once). The methods are wrapped on their classes
    for the debuggers made inside the block (their hooks are bound when they attach) and restored on leaving."""
    clock = time.perf_counter_ns
    depth = [0]
    saved: list[tuple[type, str, Any]] = []

    def timed(method: Callable[..., Any]) -> Callable[..., Any]:
        def entry(*args: Any, **kwargs: Any) -> Any:
            if depth[0]:  # inside another entry point: its clock runs already
                depth[0] += 1
                try:
                    return method(*args, **kwargs)
                finally:
                    depth[0] -= 1
            depth[0] = 1
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                total[0] += clock() - start
                depth[0] = 0

        return entry

    try:
        for module, name, methods in ENTRIES:
            cls = getattr(importlib.import_module(module), name)
            for method in methods:
                saved.append((cls, method, cls.__dict__[method]))
                setattr(cls, method, timed(cls.__dict__[method]))
        yield
    finally:
        for cls, method, original in saved:
            setattr(cls, method, original)


def run(models: dict[str, Any], kind: str, seed: int, watched: bool, inside: list[int] | None = None) -> Run:
    """One smoke run of 50 steps of the ``kind`` model on the batches of ``seed``, plain or under a fresh debugger;
    ``inside``: the running total of :func:`timed_entries`, read around each step (None: not timed)."""
    clock = time.perf_counter_ns
    model = models[kind]()
    data = models["batches"](kind, seed)
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    result = Run([])
    t0 = clock()
    dbg = NeuralDbg(model) if watched else None
    t1 = clock()
    if dbg is not None:
        sink: Callable[[Any], bool] = dbg._recorder._sink

        def keep(records: Any) -> bool:
            result.full.update((r.step, r.full) for r in records)
            return sink(records)

        dbg._recorder._sink = keep
        dbg.__enter__()
    t2 = clock()
    for step in range(STEPS):
        x, y = data[step % len(data)]
        before = inside[0] if inside is not None else 0
        t = [clock()]
        optimizer.zero_grad(set_to_none=True)
        t.append(clock())
        output = model(x)
        t.append(clock())
        loss = F.cross_entropy(output, y)
        t.append(clock())
        if dbg is not None:
            dbg.observe_loss(loss)
        t.append(clock())
        loss.backward()
        t.append(clock())
        optimizer.step()
        t.append(clock())
        result.phases.append([b - a for a, b in itertools.pairwise(t)])
        result.steps.append(t[-1] - t[0])
        if inside is not None:
            result.inside.append(inside[0] - before)
    if dbg is not None:
        t3 = clock()
        dbg.__exit__(None, None, None)
        t4 = clock()
        dbg.explain_failure()
        t5 = clock()
        result.fixed = dict(zip(FIXED, (t1 - t0, t2 - t1, t4 - t3, t5 - t4), strict=True))
        result.debugger = dbg
    return result


def groups(full: dict[int, bool]) -> dict[str, list[int]]:
    """The steps of each group: fully observed, the cheap step right after a fully observed one, the other cheap."""
    out: dict[str, list[int]] = {"fully observed": [], "cheap, after a fully observed one": [], "other cheap": []}
    for step in range(STEPS):
        if full.get(step, False):
            out["fully observed"].append(step)
        elif full.get(step - 1, False):
            out["cheap, after a fully observed one"].append(step)
        else:
            out["other cheap"].append(step)
    return out


@dataclass
class Measured:
    plain: list[float]  # median ms of each step, plain
    added: list[float]  # median ms each step adds under the debugger
    added_phases: list[list[float]]  # ... in each of PHASES
    fixed: dict[str, float]  # median ms of each of FIXED
    groups: dict[str, list[int]]
    agreed: bool  # every watched run observed the same steps fully
    inside: list[float] = field(default_factory=list)  # median ms of each step inside the debugger (--inside only)


def measure(kind: str, runs: int, warmup: int = 2, split: bool = False) -> Measured:
    """Time ``runs`` plain and watched runs of the ``kind`` model, alternating; ``split``: the watched runs also time
    the debugger's entry points (:func:`timed_entries`)."""
    models = smoke_models()
    total = [0]

    def watched_run(seed: int) -> Run:
        if not split:
            return run(models, kind, seed, True)
        with timed_entries(total):
            return run(models, kind, seed, True, total)

    for seed in range(warmup):
        watched_run(seed)
        run(models, kind, seed, False)
    plain: list[Run] = []
    watched: list[Run] = []
    for i in range(runs):
        pair = [(False, i), (True, i)] if i % 2 == 0 else [(True, i), (False, i)]
        for is_watched, seed in pair:
            got = watched_run(seed % 5) if is_watched else run(models, kind, seed % 5, False)
            if is_watched:
                watched.append(got)
            else:
                plain.append(got)
    plain_ms = [statistics.median(p.steps[s] for p in plain) / 1e6 for s in range(STEPS)]
    pairs = list(zip(watched, plain, strict=True))
    added = [statistics.median(w.steps[s] - p.steps[s] for w, p in pairs) / 1e6 for s in range(STEPS)]
    added_phases = [
        [statistics.median(w.phases[s][k] - p.phases[s][k] for w, p in pairs) / 1e6 for k in range(len(PHASES))]
        for s in range(STEPS)
    ]
    fixed = {name: statistics.median(w.fixed[name] for w in watched) / 1e6 for name in FIXED}
    inside = [statistics.median(w.inside[s] for w in watched) / 1e6 for s in range(STEPS)] if split else []
    first = watched[0].full
    agreed = all(w.full == first for w in watched)
    return Measured(plain_ms, added, added_phases, fixed, groups(first), agreed, inside)


def table(kind: str, m: Measured) -> list[str]:
    lines = [
        f"| {kind}: what | steps | plain ms a step | added ms a step (median, range) | added ms a test |",
        "|---|---|---|---|---|",
    ]
    total = 0.0
    for name, steps in m.groups.items():
        if not steps:
            continue
        added = [m.added[s] for s in steps]
        plain = statistics.median(m.plain[s] for s in steps)
        total += sum(added)
        spread = f"{statistics.median(added):.3f} ({min(added):.3f}-{max(added):.3f})"
        lines.append(f"| {name} | {len(steps)} | {plain:.3f} | {spread} | {sum(added):.2f} |")
    for name, ms in m.fixed.items():
        total += ms
        lines.append(f"| {name} | - | - | - | {ms:.2f} |")
    plain_total = sum(m.plain)
    ratio = (plain_total + total) / plain_total
    lines.append(f"| the whole run | {STEPS} | {plain_total:.2f} ms a run | - | {total:.2f} ({ratio:.2f}x) |")
    if not m.agreed:
        lines.append("(the runs did not all observe the same steps fully: the groups are the first run's)")
    return lines


def inside_table(kind: str, m: Measured) -> list[str]:
    """Each group's added milliseconds a step, split: inside the debugger's entry points, and the rest (the wrappers,
    and the training's own work slowed beside the debugger's)."""
    lines = [
        f"| {kind}: an average step of | added ms | inside the debugger | the rest | the rest's share |",
        "|---|---|---|---|---|",
    ]
    for name, steps in m.groups.items():
        if steps:
            added = statistics.mean(m.added[s] for s in steps)
            inside = statistics.mean(m.inside[s] for s in steps)
            rest = added - inside
            share = f"{rest / added:.0%}" if added > 0 else "-"
            lines.append(f"| {name} | {added:.3f} | {inside:.3f} | {rest:.3f} | {share} |")
    return lines


def phase_table(kind: str, m: Measured) -> list[str]:
    """The added milliseconds of an average step of each group, phase by phase (where in the step they are paid)."""
    lines = [f"| {kind}: added ms, an average step of | {' | '.join(PHASES)} |", "|---|" + "---|" * len(PHASES)]
    for name, steps in m.groups.items():
        if steps:
            means = [statistics.mean(m.added_phases[s][k] for s in steps) for k in range(len(PHASES))]
            lines.append(f"| {name} | {' | '.join(f'{v:.3f}' for v in means)} |")
    return lines


@dataclass
class Counted:
    calls: tuple[int, int]  # Python calls of a plain run, of a watched run (builtins included)
    functions: tuple[int, int]  # ... of them, calls of functions written in Python (each runs a frame)
    ops: tuple[int, int]  # aten operations of a plain run, of a watched run
    entries: Counter[str]  # the watched run's calls made inside the debugger, by where the debugger was entered


#: The package whose frames are the debugger's; its module wrapper (hooks.py's ``_watched_call``, the wrapped
#: ``backward``) calls the user's own code, so a call is the debugger's from the first frame outside that file.
_PACKAGE = os.path.join("neuraldbg", "")
_WRAPPERS = os.path.join("neuraldbg", "capture", "hooks.py")
WRAPPERS = "capture.hooks: nn.Module.__call__ and backward wrapped"
#: The collector's pause around an entry point (``collector.paused``): the entry point it wraps names the call.
_PAUSE = os.path.join("neuraldbg", "capture", "collector.py")


#: Calls made under a frame of these subpackages are the analysis of committed steps, wherever it was entered.
ANALYSIS = ("analysis", "detectors", "kinds")


def entry_of(frame: FrameType | None, stop: str = "run") -> str | None:
    """Where the debugger was entered for a call made in ``frame``: ``"analysis"`` when a frame of :data:`ANALYSIS`
    is on the stack below the frame of the function named ``stop`` (the loop), else the outermost frame of the
    package there, as ``module.function`` (``capture.forward.on_module_output``; the collector's pause around an
    entry point is passed over, the entry point names the call); None when the call is the training's own (no
    frame of the package, or only its wrappers)."""
    found = None
    while frame is not None and frame.f_code.co_name != stop:
        path = frame.f_code.co_filename
        at = path.rfind(_PACKAGE)
        if at >= 0 and not path.endswith(_WRAPPERS) and not (found is not None and path.endswith(_PAUSE)):
            module = path[at + len(_PACKAGE) : -3].replace(os.sep, ".")
            if module.split(".")[0] in ANALYSIS:
                return "analysis"
            found = f"{module}.{frame.f_code.co_name}"
        frame = frame.f_back
    return found


class _Calls:
    """A profile function (:func:`sys.setprofile`) counting Python calls, builtins included, and, when given a
    counter, the debugger's calls by :func:`entry_of`."""

    def __init__(self, entries: Counter[str] | None) -> None:
        self.total = 0
        self.functions = 0
        self.entries = entries

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call" and event != "c_call":
            return
        self.total += 1
        self.functions += event == "call"
        if self.entries is None:
            return
        # a C function is called from ``frame``; a Python one runs in ``frame``, called from the frame below it
        where = entry_of(frame if event == "c_call" else frame.f_back) or entry_of(frame)
        if where is None and frame.f_code.co_filename.endswith(_WRAPPERS):
            where = WRAPPERS  # the wrappers' own work (not the training they call)
        if where is not None:
            self.entries[where] += 1


class _Ops(TorchDispatchMode):
    """Counts the aten operations dispatched while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def count(kind: str, seed: int = 0) -> Counted:
    """:class:`Counted` for the ``kind`` model: each run twice beforehand (the first runs import and cache), then
    counted; calls and operations each in their own run, so that neither counter sees the other's work. The garbage
    collector is off while calls are counted: its callbacks would add calls wherever a collection happened to run."""
    models = smoke_models()
    calls: list[int] = []
    functions: list[int] = []
    ops: list[int] = []
    entries: Counter[str] = Counter()
    for watched in (False, True):
        for _ in range(2):
            run(models, kind, seed, watched)
        counter = _Calls(entries if watched else None)
        enabled = gc.isenabled()
        gc.disable()  # a collection would run the process's gc callbacks (pytest's, hypothesis's) at chance points
        sys.setprofile(counter)
        try:
            run(models, kind, seed, watched)
        finally:
            sys.setprofile(None)
            if enabled:
                gc.enable()
        calls.append(counter.total)
        functions.append(counter.functions)
        mode = _Ops()
        with mode:
            run(models, kind, seed, watched)
        ops.append(mode.count)
    return Counted((calls[0], calls[1]), (functions[0], functions[1]), (ops[0], ops[1]), entries)


def count_table(kind: str, c: Counted, top: int = 8) -> list[str]:
    lines = [
        f"| {kind}: a run of {STEPS} steps | plain | watched | added by the debugger |",
        "|---|---|---|---|",
        f"| Python calls | {c.calls[0]:,} | {c.calls[1]:,} | {c.calls[1] - c.calls[0]:,} |",
        f"| ... of functions written in Python | {c.functions[0]:,} | {c.functions[1]:,} |"
        f" {c.functions[1] - c.functions[0]:,} |",
        f"| aten operations | {c.ops[0]:,} | {c.ops[1]:,} | {c.ops[1] - c.ops[0]:,} |",
        "",
        f"| {kind}: the debugger's calls, by where it was entered | calls | share |",
        "|---|---|---|",
    ]
    inside = sum(c.entries.values())
    shown = c.entries.most_common(top)
    for where, n in shown:
        lines.append(f"| {where} | {n:,} | {n / max(inside, 1):.0%} |")
    rest = inside - sum(n for _, n in shown)
    if rest:
        lines.append(f"| elsewhere | {rest:,} | {rest / inside:.0%} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each model, plain and watched (default 15)")
    parser.add_argument("--model", action="append", choices=["mlp", "cnn"], help="only these models (repeatable)")
    parser.add_argument("--count", action="store_true", help="count calls and operations instead of timing")
    parser.add_argument(
        "--inside", action="store_true", help="also split each step's added time: inside the debugger, and the rest"
    )
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if args.count:
            print(f"smoke runs of {STEPS} steps, counted, torch {torch.__version__}, python {sys.version.split()[0]}")
            for kind in args.model or ["mlp", "cnn"]:
                print()
                print("\n".join(count_table(kind, count(kind))))
            return 0
        load = load_average()
        print(f"smoke runs of {STEPS} steps, {args.runs} runs each, torch {torch.__version__}, 1 thread, load {load}")
        for kind in args.model or ["mlp", "cnn"]:
            print()
            measured = measure(kind, args.runs, split=args.inside)
            print("\n".join(table(kind, measured)))
            print()
            print("\n".join(phase_table(kind, measured)))
            if args.inside:
                print()
                print("\n".join(inside_table(kind, measured)))
    finally:
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
