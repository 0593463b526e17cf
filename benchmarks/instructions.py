"""The debugger's cost counted in instructions, not seconds: a figure the machine's load does not move.

    python -m benchmarks.instructions                          # tiny and deep; about 25 minutes (deep: 22)
    python -m benchmarks.instructions --model mlp
    python -m benchmarks.instructions --against c74c4b3       # an earlier revision's engine beside this one

The timed benchmarks (:mod:`benchmarks.overhead`, :mod:`benchmarks.targets`) read thread CPU time on a shared
machine, where the same code's ratio moves by tenths from one round to the next; a change worth a few hundredths of
a step cannot be told from that noise. This one runs each model in one process under valgrind's callgrind with
instrumentation off, and counts the instructions executed inside the measured parts only (switched on and off
around them with ``callgrind_control``, each part dumped under its own name):

- steady state: a plain copy and a watched copy (default preset) train ``--warmup`` steps uncounted (a multiple of
  64 from step 256 on, where the schedule observes every 64th step fully), then two parts each: the fully observed
  step and the step after it, which commits it and flushes and analyses the records held since the last flush
  (``full``), and the cheap steps up to the next full one (``cheap``, 62 with the default ``--steps 64``). The
  steady figure is the two together over the 64 steps, as every 64 steps of a long run spend them; the steps the
  schedule observed fully in them are printed beside it (1 unless something suspicious opened a window);
- the first steps: a fresh plain copy trains the model's first-steps count (50; 64 for ``many``), then a fresh
  watched copy trains the same steps and is closed (counted); attaching is counted apart.

Everything runs once uncounted first, so that torch's and the engine's one-time work (lazy imports, first kernels)
falls outside the counts. One torch thread, ``PYTHONHASHSEED=0``. The count is a proxy, not a time: a cache miss or
a page fault costs no instruction, and Python's interpreter retires its instructions more slowly than torch's
kernels do, so an instruction ratio can sit below the time ratio of the same steps (the tiny model's first 50
steps: 2.77x in instructions against 3.08x in time). What it gives is a figure that the machine's load does not
move, to compare two versions of the code in one run (``--against``): what ran before in the process moves it a
little (CPython specialises its bytecode as it runs), so figures of two different scripts are not compared. Needs
``valgrind`` (with ``callgrind_control``) on the path; about 50 times slower than the steps themselves.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from . import against as beside
from .overhead import BY_NAME, Case, Runner, _fixture

#: The models measured by default: the cheapest step, and the most modules.
MODELS = ("tiny", "deep")

#: The part that counts nothing: what the counting itself costs (see :func:`net`).
EMPTY = "empty"

#: What the counted process prints before the fully observed steady steps it saw, per engine (as JSON).
_FULL_LINE = "fully observed steady steps: "
_SUMMARY = re.compile(r"^summary:\s*(\d+)\s*$", re.MULTILINE)
_TRIGGER = re.compile(r"^desc:\s*Trigger:\s*dump\s+(\S+)\s*$", re.MULTILINE)


class Missing(RuntimeError):
    """A tool the benchmark needs is not installed."""


def read_dump(text: str) -> tuple[str, int] | None:
    """The part's name and its instruction count from one callgrind dump file's text; None for a dump that no
    part asked for (callgrind writes one more when the program ends)."""
    trigger = _TRIGGER.search(text)
    summary = _SUMMARY.search(text)
    if trigger is None:
        return None
    if summary is None:
        raise ValueError(f"callgrind dump of part {trigger.group(1)!r} has no 'summary:' line")
    return trigger.group(1), int(summary.group(1))


def read_dumps(folder: Path) -> dict[str, int]:
    """Every part's instruction count from the dump files in ``folder``."""
    counts: dict[str, int] = {}
    for path in sorted(folder.iterdir()):
        found = read_dump(path.read_text(errors="replace"))
        if found is not None:
            counts[found[0]] = found[1]
    return counts


def net(counts: dict[str, int]) -> dict[str, int]:
    """Each part's count less the ``empty`` part's, what switching the counting on and off costs by itself (the
    ``callgrind_control`` calls are subprocesses: about 0.14M instructions a part); ``empty`` itself dropped."""
    empty = counts.get(EMPTY, 0)
    return {name: count - empty for name, count in counts.items() if name != EMPTY}


def tools() -> tuple[str, str]:
    """The paths of ``valgrind`` and ``callgrind_control``; :class:`Missing` names the one not found."""
    found = {name: shutil.which(name) for name in ("valgrind", "callgrind_control")}
    absent = [name for name, path in found.items() if path is None]
    if absent:
        raise Missing(
            f"{' and '.join(absent)} not found on PATH: this benchmark counts instructions under valgrind's "
            "callgrind (on Debian or Ubuntu: apt-get install valgrind)"
        )
    return found["valgrind"] or "", found["callgrind_control"] or ""


def under_callgrind(valgrind: str, out: Path, module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m module args`` under callgrind, counting off until a part switches it
    on, its dumps written to ``out``."""
    child = [sys.executable, "-m", module, *args]
    return [valgrind, "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/cg.%p", *child]


def command(valgrind: str, out: Path, model: str, steps: int, warmup: int, against: str | None) -> list[str]:
    """The command line of one model's counted process."""
    args = ["--child", model, "--steps", str(steps), "--warmup", str(warmup)]
    if against:
        args += ["--against", against]
    return under_callgrind(valgrind, out, "benchmarks.instructions", *args)


def run_counted(argv: list[str], out: Path, who: str) -> tuple[dict[str, int], str] | None:
    """Run a counted process (one torch thread, a fixed hash seed) from the repository's root: the parts' counts
    (:func:`net`) and what it printed; None, with its error printed as ``who``'s, when it failed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{who}: the counted process failed:", file=sys.stderr)
        print(done.stderr[-3000:], file=sys.stderr)
        return None
    return net(read_dumps(out)), done.stdout


def check_options(parser: argparse.ArgumentParser, models: Sequence[str], steps: int, warmup: int) -> None:
    """Refuse, through ``parser``, a model that is not one of :data:`~benchmarks.overhead.BY_NAME` and steady steps
    that would not begin at a fully observed step or hold no cheap one."""
    for name in models:
        if name not in BY_NAME:
            parser.error(f"--model {name!r}: expected one of {', '.join(BY_NAME)}")
    if steps < 3:
        parser.error(f"--steps {steps}: expected at least 3 (a full step, the one after it, a cheap one)")
    if warmup < 256 or warmup % 64:
        parser.error(f"--warmup {warmup}: expected a multiple of 64 from 256 on (a fully observed step next)")


def found_tools(who: str) -> tuple[str, str] | None:
    """:func:`tools`, or None with what is missing printed as ``who``'s."""
    try:
        return tools()
    except Missing as exc:
        print(f"{who}: {exc}", file=sys.stderr)
        return None


class Counter:
    """Switches callgrind's counting on around one part of this process and dumps it under the part's name."""

    def __init__(self, control: str, run: Callable[[list[str]], object] | None = None) -> None:
        self._control = control
        self._pid = str(os.getpid())
        self._run = run or (lambda argv: subprocess.run(argv, check=True, stdout=subprocess.DEVNULL))

    def _ctl(self, *args: str) -> None:
        self._run([self._control, *args, self._pid])

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Count what runs inside under ``name``. A full collection runs first, uncounted: every part starts with
        the garbage collector's generations empty, so that how many collections fall inside it does not depend on
        what ran before (identical engines differed by 4 % a cheap step without it)."""
        gc.collect()
        self._ctl("--instr=on")
        self._ctl("--zero")
        try:
            yield
        finally:
            self._ctl(f"--dump={name}")
            self._ctl("--instr=off")


def _child(model: str, steps: int, warmup: int, against: str | None, counter: Counter) -> dict[str, int]:
    """One model's counted parts (see the module), in this process; the fully observed steady steps per engine."""
    torch.set_num_threads(1)
    case = BY_NAME[model]
    state, batches = _fixture(case)
    engines: dict[str, type[Runner]] = {"watched": Runner}
    with tempfile.TemporaryDirectory() as tmp:
        if against:
            base = beside.load_base(against, Path(tmp))
            engines["base"] = _runner_of(base.NeuralDbg)
        return count_parts(case, state, batches, steps, warmup, engines, counter)


def _runner_of(debugger: Any) -> type[Runner]:
    """A :class:`~benchmarks.overhead.Runner` whose copy is watched by ``debugger`` (another revision's)."""

    class Beside(Runner):
        def __init__(self, case: Case, state: dict[str, torch.Tensor], preset: str | None) -> None:
            super().__init__(case, state, None)
            if preset:
                self.dbg = debugger(self.model, preset=preset)

    return Beside


def count_parts(
    case: Case,
    state: dict[str, torch.Tensor],
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    warmup: int,
    engines: dict[str, type[Runner]],
    counter: Counter,
) -> dict[str, int]:
    """The steady parts and the first steps of a plain copy and of each engine's watched copy, each counted inside
    ``counter.part``. ``engines``: the Runner class of each watched copy, by the prefix of its parts. Returns, per
    engine, the steps its schedule observed fully among the ``steps`` steady ones."""
    first = case.first
    full: dict[str, int] = {}
    with counter.part(EMPTY):
        pass
    # once through everything uncounted: torch's and the engines' one-time work falls outside the counts
    for cls, preset in [(Runner, None), *((cls, "default") for cls in engines.values())]:
        cls(case, state, preset).run(batches, 0, first)  # a watched copy attached and closed around its steps
    copies = {"plain": Runner(case, state, None)}
    copies.update({prefix: cls(case, state, "default") for prefix, cls in engines.items()})
    for prefix, copy in copies.items():
        if copy.dbg is not None:
            copy.dbg.attach()
        copy.run(batches, 0, warmup, attach=False)
        with counter.part(f"{prefix}_full"):
            copy.run(batches, warmup, 2, attach=False)
        with counter.part(f"{prefix}_cheap"):
            copy.run(batches, warmup + 2, steps - 2, attach=False)
        if copy.dbg is not None:
            schedule = copy.dbg._recorder.schedule
            full[prefix] = sum(schedule.is_full(step) for step in range(warmup, warmup + steps))
            copy.dbg.close()
    plain = Runner(case, state, None)
    with counter.part("plain_first"):
        plain.run(batches, 0, first)
    for prefix, cls in engines.items():
        fresh = cls(case, state, "default")
        assert fresh.dbg is not None
        with counter.part("attach" if prefix == "watched" else f"{prefix}_attach"):
            fresh.dbg.attach()
        with counter.part(f"{prefix}_first"):
            fresh.run(batches, 0, first, attach=False)
            fresh.dbg.close()
    return full


def steady(counts: dict[str, int], prefix: str) -> int | None:
    """The instructions of a copy's steady steps, its full pair and its cheap steps together."""
    full, cheap = counts.get(f"{prefix}_full"), counts.get(f"{prefix}_cheap")
    return None if full is None or cheap is None else full + cheap


def table(rows: Sequence[tuple[str, dict[str, int], dict[str, int], int, int]], against: str | None) -> list[str]:
    """The printed table, a row per model ``(model, counts, full steps per engine, steady steps, first steps)``:
    instructions per step, what the debugger adds to a cheap step and to a full step with the one after it, and the
    watched/plain ratios (``base``: the other revision's engine)."""

    def ratio(watched: int | None, plain: int | None) -> str:
        return f"{watched / plain:.3f}x" if watched is not None and plain else "-"

    def added(counts: dict[str, int], prefix: str, part: str, n: int) -> str:
        mine, plain = counts.get(f"{prefix}_{part}"), counts.get(f"plain_{part}")
        return f"{(mine - plain) / n / 1e6:+.3f}M" if mine is not None and plain is not None else "-"

    labels = {"watched": "", "base": "base: "} if against else {"watched": ""}
    head = "| model | plain step |"
    for label in labels.values():
        head += f" {label}cheap step added | {label}full step and next added | {label}steady ratio (full steps) |"
    head += " first steps, plain step |"
    head += "".join(f" {label}first steps ratio |" for label in labels.values())
    head += " attach |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for model, counts, full, steps, first in rows:
        plain = steady(counts, "plain")
        cells = [model, f"{plain / steps / 1e6:.3f}M" if plain is not None else "-"]
        for prefix in labels:
            cells.append(added(counts, prefix, "cheap", steps - 2))
            cells.append(added(counts, prefix, "full", 1))
            cells.append(f"{ratio(steady(counts, prefix), plain)} ({full.get(prefix, '-')})")
        cells.append(f"{counts['plain_first'] / first / 1e6:.3f}M" if "plain_first" in counts else "-")
        cells += [ratio(counts.get(f"{prefix}_first"), counts.get("plain_first")) for prefix in labels]
        cells.append(f"{counts['attach'] / 1e6:.1f}M" if "attach" in counts else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help=f"a model of benchmarks.overhead (default: {MODELS})")
    parser.add_argument(
        "--steps",
        type=int,
        default=64,
        help="counted steady steps per copy: the full step, the one after it and the cheap steps after them (default"
        " 64, up to the next full step; more take in more full steps, counted in the table)",
    )
    parser.add_argument("--warmup", type=int, default=320, help="uncounted steps before them (default 320)")
    parser.add_argument("--against", metavar="REVISION", help="also count this git revision's engine")
    parser.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_options(parser, [*(args.model or ()), *([args.child] if args.child else [])], args.steps, args.warmup)
    found = found_tools("benchmarks.instructions")
    if found is None:
        return 2
    valgrind, control = found
    if args.child:
        full = _child(args.child, args.steps, args.warmup, args.against, Counter(control))
        print(_FULL_LINE + json.dumps(full))
        return 0
    models = args.model or list(MODELS)
    print(
        f"instructions counted by valgrind's callgrind, 1 torch thread, {args.steps} steady steps after {args.warmup}"
    )
    rows = []
    for model in models:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            argv_ = command(valgrind, out, model, args.steps, args.warmup, args.against)
            done = run_counted(argv_, out, f"benchmarks.instructions: {model}")
            if done is None:
                return 1
            counts, printed = done
            full = json.loads(printed.split(_FULL_LINE)[-1].splitlines()[0])
            rows.append((model, counts, full, args.steps, BY_NAME[model].first))
    print()
    print("\n".join(table(rows, args.against)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
