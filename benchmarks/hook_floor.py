"""What a forward hook that does nothing costs a model's forward pass: the floor under any monitor that sees every
module call.

    python -m benchmarks.hook_floor                  # the deep 200x32 MLP (401 module calls per forward pass)
    python -m benchmarks.hook_floor --model tiny --model transformer

Once any forward hook exists, torch's module call leaves its fast path (a direct call of ``forward``) for the one
that collects and calls hooks, for every module when the hook is global and for every hooked module otherwise.
Three ways are timed side by side in one process, in rotating order, on the same model and batch, one torch
thread, under grad mode (as in training): no hook, one global hook (``register_module_forward_hook``, as NeuralDBG
registers its own), and one hook on each leaf module (the hand-written bound of ``benchmarks.peers``). Each hook
returns None at once. Printed: the median forward time of each, over rounds, and the difference from the plain
forward.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

from neuraldbg.capture import hooks

from .overhead import CASES, _fixture


def _nothing(*args: Any) -> None:
    return None


@contextmanager
def _plain(model: nn.Module) -> Iterator[None]:
    yield


@contextmanager
def _global(model: nn.Module) -> Iterator[None]:
    # NeuralDBG's handle: its removal also drops the with_kwargs flag torch keeps for a removed global hook
    with hooks.HookHandle([register_module_forward_hook(_nothing, with_kwargs=True)]):
        yield


@contextmanager
def _per_leaf(model: nn.Module) -> Iterator[None]:
    handles = [m.register_forward_hook(_nothing) for m in model.modules() if next(m.children(), None) is None]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


WAYS: dict[str, Callable[[nn.Module], Any]] = {
    "no hook": _plain,
    "one global hook": _global,
    "a hook per leaf module": _per_leaf,
}


def measure(name: str, rounds: int = 7, calls: int = 30) -> dict[str, float]:
    """Median seconds per forward pass of the model of ``benchmarks.overhead`` named ``name``, for each way."""
    case = next(c for c in CASES if c.build.__name__ == name)
    state, batches = _fixture(case)
    model = case.build()
    model.load_state_dict(state)
    x = batches[0][0]
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    ways = list(WAYS)
    for r in range(rounds):
        for way in ways[r % len(ways) :] + ways[: r % len(ways)]:
            with WAYS[way](model):
                model(x)  # once untimed: the first call after a change of hooks
                t0 = time.thread_time()
                for _ in range(calls):
                    model(x)
                times[way].append((time.thread_time() - t0) / calls)
    return {way: statistics.median(ts) for way, ts in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[c.build.__name__ for c in CASES], action="append")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, thread CPU time per forward pass, median of {args.rounds} rounds")
    print()
    print("| model | " + " | ".join(WAYS) + " |")
    print("|---|" + "---|" * len(WAYS))
    for name in args.model or ["deep"]:
        found = measure(name, args.rounds)
        plain = found["no hook"]
        cells = [f"{plain * 1e6:.0f} us"]
        cells += [f"{found[w] * 1e6:.0f} us (+{(found[w] - plain) * 1e6:.0f})" for w in list(WAYS)[1:]]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
