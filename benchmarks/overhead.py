"""Step-time and memory overhead of NeuralDBG, measured side by side in one process.

    python -m benchmarks.overhead            # the figures of docs/cost.md (about 2 minutes on 2 CPU cores)
    python -m benchmarks.overhead --quick    # a smoke run
    python -m benchmarks.overhead --peers    # NeuralDBG next to other monitors instead (benchmarks/peers.py)

For each model, identical copies (same initial weights, same batches) are trained in alternating blocks of
steps: one plain, one per preset under NeuralDbg. A debugger is attached for its own blocks only (its hooks
are global, so the other copies would otherwise pay for them) and its run continues from block to block; what a
run does once, attaching and removing the hooks, is not timed, the commit and flush of each block's last step is
(see :meth:`Runner.run`). The
first ``--warmup`` steps are not timed, so the figures are the steady-state cost per step; the dense observation
of the first steps, which a short smoke test pays, is reported separately as "first 50 steps" (a fresh watched
copy against a fresh plain one, from step 0: :func:`first_steps`). The ratio is the median, over rounds, of a
watched block's time over the plain block of the same round.

Memory: a model whose ReLU layer flips between dead and alive every few steps runs for 2k and 20k steps; the
number of stored events, of history points, and the process RSS must not grow with the number of steps.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from neuraldbg import NeuralDbg, NeuralDbgWarning  # noqa: E402

warnings.simplefilter("error", NeuralDbgWarning)  # a debugger that stopped observing would look free

PRESETS = ("default", "economy", "full")


@dataclass
class Case:
    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    block: int  # steps per timed block
    first: int = 50  # the fresh debugger's first steps, measured apart (a smoke test's whole run)


def tiny() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 1))


def mlp() -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(512, 10))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


class Transformer(nn.Module):
    """A small language-model-like transformer: embedding, 2 encoder layers, a vocabulary head."""

    def __init__(self, vocab: int = 256, d: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens))).flatten(0, 1)


def transformer() -> nn.Module:
    return Transformer()


def deep() -> nn.Module:
    """200 narrow Linear+ReLU layers with residual-free default init: the many-module case, where per-module
    work dominates (its gradients really do vanish at init, so the debugger also observes densely)."""
    layers: list[nn.Module] = []
    for _ in range(200):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(32, 1))


class Many(nn.Module):
    """5,000 parameter tensors (2,500 small residual Linear layers): a model whose cost is per tensor and per module,
    like a large model's hundreds of layers, at a size a CPU trains in milliseconds."""

    def __init__(self, layers: int = 2500, width: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.scale = 1.0 / layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + self.scale * layer(x)
        return x


def many() -> nn.Module:
    return Many()


CASES = [
    Case(
        "tiny (README model, batch 32)",
        tiny,
        lambda g: (torch.randn(32, 10, generator=g), torch.randn(32, 1, generator=g)),
        F.mse_loss,
        200,
    ),
    Case(
        "MLP 8x512 ReLU, batch 128",
        mlp,
        lambda g: (torch.randn(128, 512, generator=g), torch.randint(0, 10, (128,), generator=g)),
        F.cross_entropy,
        8,
    ),
    Case(
        "CNN Conv-BN-ReLU x2, 32x32, batch 64",
        cnn,
        lambda g: (torch.randn(64, 3, 32, 32, generator=g), torch.randint(0, 10, (64,), generator=g)),
        F.cross_entropy,
        2,
    ),
    Case(
        "transformer 2x64, 4 heads, seq 32, batch 16",
        transformer,
        lambda g: (torch.randint(0, 256, (16, 32), generator=g), torch.randint(0, 256, (16 * 32,), generator=g)),
        F.cross_entropy,
        4,
    ),
    Case(
        "deep narrow MLP 200x32 ReLU, batch 32",
        deep,
        lambda g: (torch.randn(32, 32, generator=g), torch.randn(32, 1, generator=g)),
        F.mse_loss,
        4,
    ),
    Case(
        "5,000 parameter tensors (2,500 Linear 8x8), batch 16",
        many,
        lambda g: (torch.randn(16, 8, generator=g), torch.randn(16, 8, generator=g)),
        F.mse_loss,
        2,
        first=64,
    ),
]


def load_average() -> str:
    """The machine's load averages over 1, 5 and 15 minutes, for a benchmark's printout ("unknown" where the
    platform has none)."""
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "unknown"


#: The models by the name of the function that builds them (``tiny``, ``mlp``, ``cnn``, ``transformer``, ``deep``,
#: ``many``).
BY_NAME = {case.build.__name__: case for case in CASES}


def finish_steps(dbg: NeuralDbg) -> None:
    """The per-step part of ``dbg.close()``, which it begins with: the last step committed, flushed and analysed. The
    steady blocks time it and leave out the removal of the hooks that follows, which a run does once (``dbg`` may be
    another revision's debugger, see ``benchmarks.against``)."""
    dbg._recorder.finish()


class Runner:
    """One copy of the model with its optimizer and (optionally) its debugger."""

    def __init__(
        self, case: Case, state: dict[str, torch.Tensor], preset: str | None, compiled: str | None = None
    ) -> None:
        self.model = case.build()
        self.model.load_state_dict(state)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.loss = case.loss
        # compiled: None (eager), "plain" (no debugger), "compiled" (the debugger wraps the compiled module) or
        # "original" (the debugger wraps the module that torch.compile compiled)
        self.forward = torch.compile(self.model) if compiled else self.model
        watched = self.forward if compiled == "compiled" else self.model
        self.dbg = NeuralDbg(watched, preset=preset) if preset else None
        self.steps = 0

    def run(self, batches: list[tuple[torch.Tensor, torch.Tensor]], start: int, n: int, attach: bool = True) -> float:
        """Train ``n`` steps; seconds per step. The debugger is attached for its own blocks only: its hooks are
        global, and the other copies must not pay for them (``attach()`` after ``close()`` continues the same run).
        What a run does once is not timed: attaching (a block of a few steps would carry a whole attachment, 4 ms
        for the deep model's 400 parameters) and removing the hooks when it closes (0.3-1 ms, most of it putting
        ``nn.Module.__call__`` back); what every step does is: the block's last step is committed, flushed and
        analysed inside the timing (``close()`` begins with that). A longer run pays the same work later, the commit
        at its next forward and the flush at its next fully observed step or every 64 steps: flushing each block's
        few steps at once, if anything, errs high.
        ``attach=False``: the caller attaches and closes the debugger around several blocks."""
        if self.dbg is not None and attach:
            self.dbg.attach()  # not timed: a run attaches once (benchmarks.peers prints what it costs)
        t0 = time.perf_counter()
        for i in range(start, start + n):
            x, y = batches[i % len(batches)]
            self.opt.zero_grad(set_to_none=True)
            self.loss(self.forward(x), y).backward()
            self.opt.step()
        if self.dbg is not None and attach:
            finish_steps(self.dbg)  # timed
        seconds = (time.perf_counter() - t0) / n
        if self.dbg is not None and attach:
            self.dbg.close()  # not timed: the hooks removed (its own finish finds nothing left to do)
        self.steps += n
        return seconds

    def close(self) -> None:
        if self.dbg is not None and self.dbg.steps != self.steps:  # pragma: no cover
            raise RuntimeError(f"the debugger observed {self.dbg.steps} of {self.steps} steps: figures are void")


def _fixture(case: Case) -> tuple[dict[str, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """The initial weights every copy starts from, and the 16 batches they all train on."""
    torch.manual_seed(0)
    state = case.build().state_dict()
    g = torch.Generator().manual_seed(0)
    return state, [case.batch(g) for _ in range(16)]


def measure(
    case: Case, warmup: int, rounds: int, presets: Sequence[str] = PRESETS, first: bool = True
) -> dict[str, float]:
    """Each of ``presets`` against a plain copy in alternating blocks (see the module), and, with ``first``, the
    first steps of a fresh debugger (:func:`first_steps`, as ``"first50"``)."""
    state, batches = _fixture(case)
    runners = {"plain": Runner(case, state, None), **{p: Runner(case, state, p) for p in presets}}
    for r in runners.values():
        r.run(batches, 0, warmup)
    times: dict[str, list[float]] = {name: [] for name in runners}
    step = warmup
    names = list(runners)
    for round_ in range(rounds):
        shift = round_ % len(names)  # rotate who goes first: no copy always follows the same one
        for name in names[shift:] + names[:shift]:
            times[name].append(runners[name].run(batches, step, case.block))
        step += case.block
    for r in runners.values():
        r.close()
    # each round's watched block over the plain block run just before it: pairs see the same machine state,
    # and the median of the pairs resists the drift a shared machine has between rounds
    plain = times["plain"]
    result = {
        name: statistics.median(t / p for t, p in zip(ts, plain, strict=True))
        for name, ts in times.items()
        if name != "plain"
    }
    result["plain_ms"] = statistics.median(plain) * 1e3
    if first:
        result["first50"] = first_steps(case, state, batches, case.first)
    return result


def first_steps(case: Case, state: dict[str, torch.Tensor], batches: list, n: int = 50) -> float:
    """Cost over the first ``n`` steps of a fresh debugger (a smoke test's whole run), run as a smoke test runs
    them: a fresh watched copy trains its ``n`` steps in one go, attached once before them and closed once after
    (the close, which commits and flushes the last step, is timed; attaching is not: ``benchmarks.peers`` prints
    it, and the diagnosis at exit), against the mean of two fresh plain copies that train the same ``n`` steps,
    one just before it and one just after (both allocate their optimizer's state at step 0, as the watched copy
    does; the debugger's first, fully observed step carries its one-time work). The debugger's hooks are global:
    it is attached only while its own copy trains."""

    def plain() -> float:
        return Runner(case, state, None).run(batches, 0, n) * n

    before = plain()
    fresh = Runner(case, state, "default")
    assert fresh.dbg is not None
    fresh.dbg.attach()  # not timed: a run attaches once
    seconds = fresh.run(batches, 0, n, attach=False) * n
    start = time.perf_counter()
    fresh.dbg.close()
    watched = seconds + time.perf_counter() - start
    return watched / ((before + plain()) / 2)


def compiled(case: Case, warmup: int, rounds: int) -> dict[str, float]:
    """Steady-state step time of a torch.compile'd model, plain and watched in both wirings; also the graph
    breaks and new graphs Dynamo counted while the timed blocks ran (both must stay 0).

    Compiled graphs are keyed by code, not by model, and a debugger attaching after a graph was compiled
    without its hook has that graph compiled again. So the copies are not alternated block by block as in
    :func:`measure`: each takes a short phase of 3 blocks (attached once, 10 untimed steps first; ``warmup`` in
    its first phase), in the same order every repeat (plain, on the compiled module, on the original), and one more
    plain phase closes the last repeat. Each ratio is the median over repeats of a watched phase against the mean
    of the two plain phases around it: load that drifts over minutes moves both sides of a ratio alike (with two
    long phases per copy, drift alone gave ratios from 0.82x to 1.10x)."""
    from torch._dynamo.utils import counters

    state, batches = _fixture(case)
    runners = {
        "plain": Runner(case, state, None, "plain"),
        "compiled": Runner(case, state, "default", "compiled"),
        "original": Runner(case, state, "default", "original"),
    }
    times: dict[str, list[float]] = {name: [] for name in runners}
    breaks = graphs = 0

    def phase(name: str) -> None:
        nonlocal breaks, graphs
        r = runners[name]
        if r.dbg is not None:
            r.dbg.attach()
        r.run(batches, r.steps, warmup if r.steps == 0 else 10, attach=False)
        counters.clear()
        times[name].append(statistics.median(r.run(batches, r.steps, case.block, attach=False) for _ in range(3)))
        breaks += sum(counters["graph_break"].values())
        graphs += counters["stats"]["unique_graphs"]
        if r.dbg is not None:
            r.dbg.close()

    for _ in range(max(3, rounds // 5)):
        for name in runners:
            phase(name)
    phase("plain")
    for r in runners.values():
        r.close()
    plain = times["plain"]
    around = [(a + b) / 2 for a, b in itertools.pairwise(plain)]
    result: dict[str, float] = {"plain_ms": statistics.median(plain) * 1e3}
    for name in ("compiled", "original"):
        found = [t / p for t, p in zip(times[name], around)]
        result[name] = statistics.median(found)
        result[name + "_low"], result[name + "_high"] = min(found), max(found)
    result["graph_breaks"], result["recompiles"] = breaks, graphs
    return result


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # not Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory(checkpoints: tuple[int, ...]) -> list[tuple[int, int, int, float]]:
    """(steps, stored events, history points, RSS MB) on a run whose ReLU layer flaps dead/alive."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    rows = []
    with NeuralDbg(model) as dbg:
        for step in range(1, max(checkpoints) + 1):
            with torch.no_grad():
                model[2].bias.fill_(-100.0 if (step // 100) % 2 else 0.1)  # dead for 100 steps, alive for 100
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            if step in checkpoints:
                events = len(dbg.events)
                points = sum(len(s) for s in dbg.history.series.values())
                rows.append((step, events, points, rss_mb()))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke run")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument(
        "--model",
        choices=["tiny", "mlp", "cnn", "transformer", "deep", "many"],
        action="append",
        help="only these models",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory run")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile table")
    parser.add_argument("--peers", action="store_true", help="only the table of benchmarks.peers")
    args = parser.parse_args(argv)
    if args.peers:
        from . import peers

        peers.table(args.model, args.quick)
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds, warmup = (6, 40) if args.quick else (40, 300)
    python = sys.version.split()[0]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, python {python}")
    print()
    print("| model | plain step | default | economy | full | default, first steps (50; many: 64) |")
    print("|---|---|---|---|---|---|")
    for case in CASES:
        if args.model and case.build.__name__ not in args.model:
            continue
        r = measure(case, warmup, rounds)
        print(
            f"| {case.name} | {r['plain_ms']:.2f} ms | {r['default']:.3f}x | {r['economy']:.3f}x | {r['full']:.3f}x |"
            f" {r['first50']:.2f}x ({case.first}) |"
        )
    if not args.no_compile:
        print()
        print("| torch.compile'd model | plain step | on the compiled module (range) | on the original |")
        print("|---|---|---|---|")
        added = 0
        for case in CASES:
            if case.build.__name__ not in ("mlp", "cnn", "transformer"):
                continue
            if args.model and case.build.__name__ not in args.model:
                continue
            r = compiled(case, 20 if args.quick else 60, rounds)
            added += int(r["graph_breaks"] + r["recompiles"])
            cells = [f"{r[w]:.3f}x ({r[w + '_low']:.2f}-{r[w + '_high']:.2f})" for w in ("compiled", "original")]
            print(f"| {case.name} | {r['plain_ms']:.2f} ms | {cells[0]} | {cells[1]} |")
        print(f"graph breaks and new graphs compiled during the timed steps: {added}")
    if args.no_memory:
        return 0
    print()
    checkpoints = (200, 2000) if args.quick else (2000, 20000)
    print("| steps | stored events | history points | RSS |")
    print("|---|---|---|---|")
    for steps, events, points, rss in memory(checkpoints):
        print(f"| {steps} | {events} | {points} | {rss:.0f} MB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
