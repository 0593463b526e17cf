"""What each part of a cheap step costs, in instructions: the same cheap steps counted with the debugger as it is and
with one of its parts switched off.

    python -m benchmarks.cheap_parts                    # the tiny model, about 2 minutes
    python -m benchmarks.cheap_parts --model deep       # the deep MLP: eight copies of 384 steps under valgrind

A cheap step is what a long run pays on 63 steps in 64, and the parts of it are a few small callbacks each, too
small for a clock on a shared machine to tell apart. Like :mod:`benchmarks.instructions` (whose counter this uses),
each model runs in one process under valgrind's callgrind, counting only inside the measured parts. After
``--warmup`` uncounted steps and the fully observed step and the one after it, each copy counts the cheap steps up
to the next full one: a plain copy, a watched copy (default preset), and one watched copy more per part of
:data:`PARTS`, with that part switched off for the counted steps only. What a part costs a cheap step is the
watched copy's count less that copy's; what it leaves is printed beside it, and the watched step's whole addition.

A part switched off changes what the step records (no fingerprints, no finite check...), so its copy is closed
after its count and never judged: the figure is a cost, not a behaviour. The parts overlap a little (the output's
check lets go of the kept layer outputs), so they do not add up to the whole exactly. Compare within one run: what
ran earlier in the process moves a count by a few per cent (see :mod:`benchmarks.instructions`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

from neuraldbg.capture import hooks
from neuraldbg.capture.forward import ForwardPath
from neuraldbg.capture.gradients import GradientReader
from neuraldbg.capture.ledger import GradLedger

from .instructions import EMPTY, Counter, check_options, found_tools, run_counted, under_callgrind
from .overhead import BY_NAME, Case, Runner, _fixture


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


@contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` inside."""
    before = owner.__dict__[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


@contextmanager
def _emptied(container: Any) -> Iterator[None]:
    """``container`` (a list or a dict) empty inside, its items back afterwards."""
    saved = container.copy()
    container.clear()
    try:
        yield
    finally:
        container.clear()
        if isinstance(container, dict):
            container.update(saved)
        else:
            container.extend(saved)


def _no_listener() -> ExitStack:
    stack = ExitStack()
    stack.enter_context(_emptied(hooks._backward_listeners))  # the ledger's is the only one
    stack.enter_context(_replaced(GradLedger, "before_step", _nothing))
    stack.enter_context(_replaced(GradLedger, "after_step", _nothing))
    return stack


#: The parts of a cheap step, each with what switches it off (a context manager).
PARTS: dict[str, Callable[[], Any]] = {
    "backward listener (the loss, the .grad ledger)": _no_listener,
    "gradients' finite check": lambda: _replaced(GradientReader, "check_finite", _nothing),
    "head gradient probe": lambda: _replaced(GradientReader, "read_head", _nothing),
    "samples' fingerprints": lambda: _replaced(ForwardPath, "_fingerprint", _nothing),
    "output's check": lambda: _replaced(ForwardPath, "_check_ends", _nothing),
    "layer outputs kept": lambda: _emptied(hooks._layers),
}


def count_cheap(
    case: Case,
    state: dict[str, torch.Tensor],
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    warmup: int,
    counter: Counter,
    parts: Sequence[str] = tuple(PARTS),
) -> None:
    """Count the cheap steps after ``warmup`` steps and the two after them: ``plain``, ``watched`` and, per part of
    ``parts``, a watched copy with that part switched off while it is counted (parts numbered in order)."""
    with counter.part(EMPTY):
        pass
    Runner(case, state, None).run(batches, 0, case.first)  # torch's and the engine's one-time work, uncounted
    Runner(case, state, "default").run(batches, 0, case.first)
    copies: list[tuple[str, str | None, str | None]] = [("plain", None, None), ("watched", "default", None)]
    copies += [(f"off{i}", "default", name) for i, name in enumerate(parts)]
    for label, preset, part in copies:
        copy = Runner(case, state, preset)
        if copy.dbg is not None:
            copy.dbg.attach()
        copy.run(batches, 0, warmup + 2, attach=False)
        with PARTS[part]() if part is not None else ExitStack(), counter.part(label):
            copy.run(batches, warmup + 2, steps - 2, attach=False)
        if copy.dbg is not None:
            copy.dbg.close()


def table(model: str, counts: dict[str, int], cheap_steps: int, parts: Sequence[str] = tuple(PARTS)) -> list[str]:
    """A row per part: what it costs a cheap step, and what the watched step adds without it."""
    plain, watched = counts["plain"], counts["watched"]
    lines = [
        f"{model}: a plain step {plain / cheap_steps / 1e6:.3f}M instructions, "
        f"a cheap step adds {(watched - plain) / cheap_steps / 1e6:+.3f}M",
        "",
        "| part switched off | it costs a cheap step | the cheap step adds without it |",
        "|---|---|---|",
    ]
    for i, name in enumerate(parts):
        off = counts.get(f"off{i}")
        if off is None:
            lines.append(f"| {name} | - | - |")
            continue
        lines.append(
            f"| {name} | {(watched - off) / cheap_steps / 1e6:.4f}M | {(off - plain) / cheap_steps / 1e6:+.4f}M |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="a model of benchmarks.overhead (default: tiny)")
    parser.add_argument("--steps", type=int, default=64, help="steps from a full one to the next (default 64)")
    parser.add_argument("--warmup", type=int, default=320, help="uncounted steps first (default 320)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_options(parser, [args.model], args.steps, args.warmup)
    found = found_tools("benchmarks.cheap_parts")
    if found is None:
        return 2
    valgrind, control = found
    case = BY_NAME[args.model]
    if args.child:
        torch.set_num_threads(1)
        state, batches = _fixture(case)
        count_cheap(case, state, batches, args.steps, args.warmup, Counter(control))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        args_ = ["--child", "--model", args.model, "--steps", str(args.steps), "--warmup", str(args.warmup)]
        argv_ = under_callgrind(valgrind, Path(tmp), "benchmarks.cheap_parts", *args_)
        done = run_counted(argv_, Path(tmp), f"benchmarks.cheap_parts: {args.model}")
    if done is None:
        return 1
    counts = done[0]
    print(
        f"instructions counted by valgrind's callgrind, 1 torch thread, {args.steps - 2} cheap steps after "
        f"{args.warmup + 2}"
    )
    print("\n".join(table(args.model, counts, args.steps - 2)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
