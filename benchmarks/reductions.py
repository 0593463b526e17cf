"""The reductions a CPU takes slowly, beside what the debugger takes instead, on the tensors where it meets them.

    python -m benchmarks.reductions              # about 20 seconds
    python -m benchmarks.reductions --rounds 21

A few of torch's CPU reductions run far slower than their cost in memory reads says: the inf norm of a tensor
(``vector_norm(inf)``, ``_foreach_norm(inf)``), ``any()``, ``isnan().any()``, ``aminmax`` along a dimension, ``amax``
over a channel-first map's batch and space at once, the L1 norm. Each row times torch's way and the debugger's (the
same answer from reductions that run at the speed of reading the tensor: see ``neuraldbg/stats/tensors.py``) in
alternating blocks in one process, one torch thread, and prints the medians, their ratio and whether the answers
are equal (bit for bit, NaN for NaN; the L1 norm sums in another order: its largest relative difference instead).
The tensors are those the debugger reads where each one runs: the deep 200x32 MLP's vanishing gradients (norm 0:
their largest magnitude says whether they are exactly 0), an 8x512 MLP's weight gradients, a CNN's 64-channel
32x32 maps, a language model's logits.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from neuraldbg.stats import tensors as stats

from .overhead import load_average


@dataclass(frozen=True)
class Case:
    what: str  # the reading and where the debugger takes it
    tensors: str  # what it reads
    torch_way: Callable[[], object]
    ours: Callable[[], object]
    exact: bool = True  # the answers are equal bit for bit (else: to rounding, the largest relative difference shown)


def _randn(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def cases(scale: int = 1) -> list[Case]:
    """The rows. ``scale`` divides the tensors' sizes (tests run them small)."""
    n = max(1, 512 // scale)
    # the deep MLP's: norms read 0 (underflow); at least a group, so that the debugger stacks them
    zero_grads = [_randn(32, 32, seed=i) * 1e-30 for i in range(max(stats.MIN_GROUP, 200 // scale))]
    mlp_grads = [_randn(n, n, seed=i) for i in range(8)] + [_randn(n, seed=10 + i) for i in range(8)]
    weight = _randn(n, n, seed=20)
    weight[3] = 0.0
    cmap = _randn(64 // scale or 1, 64, 32, 32, seed=21)
    logits_grad = _randn(16, 32 // scale or 1, 1000, seed=22)

    def torch_rows() -> Tensor:  # what the debugger's stacked group did before: its stack, then the inf norm
        return torch.linalg.vector_norm(torch.stack(zero_grads).view(len(zero_grads), -1), math.inf, dim=1)

    def torch_zero_rows() -> Tensor:
        low, high = torch.aminmax(weight, dim=1)
        return (low == 0) & (high == 0)

    return [
        Case(
            "largest magnitude of stacked gradients (norm 0)",
            f"{len(zero_grads)} of 32 x 32",
            torch_rows,
            lambda: stats.norm_readings(zero_grads, math.inf),
        ),
        Case(
            "largest magnitudes of a parameter list's gradients",
            f"{len(mlp_grads)} gradients of a {n}-wide MLP",
            lambda: torch.stack(torch._foreach_norm(mlp_grads, math.inf)),
            lambda: stats.norm_readings(mlp_grads, math.inf),
        ),
        Case(
            "largest magnitude of one gradient",
            f"{n} x {n}",
            lambda: torch.linalg.vector_norm(weight, math.inf),
            lambda: stats.largest_magnitude(weight),
        ),
        Case(
            "whether a gradient holds a nonzero",
            f"{n} x {n}",
            lambda: bool(weight.any()),
            lambda: stats.any_nonzero(weight),
        ),
        Case(
            "whether an argument holds a NaN",
            f"{n} x {n}",
            lambda: bool(torch.isnan(weight).any()),
            lambda: bool(stats.has_nan(weight)),
        ),
        Case(
            "units with exactly zero gradient", f"{n} x {n}", torch_zero_rows, lambda: stats.zero_gradient_units(weight)
        ),
        Case(
            "units never positive on a channel-first map",
            " x ".join(map(str, cmap.shape)),
            lambda: cmap.amax(dim=[0, 2, 3]) <= 0,
            lambda: stats.never_positive(cmap, channel_first=True),
        ),
        Case(
            "the loss gradient's L1 norm",
            " x ".join(map(str, logits_grad.shape)),
            lambda: torch.linalg.vector_norm(logits_grad, 1),
            lambda: logits_grad.abs().sum(),
            exact=False,
        ),
    ]


def _time(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def compare(answer: object, want: object, exact: bool) -> tuple[bool, float]:
    """Whether two answers are equal (NaN equal to NaN), and their largest relative difference."""
    a = answer if isinstance(answer, Tensor) else torch.tensor(answer)
    b = want if isinstance(want, Tensor) else torch.tensor(want)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, math.inf
    if a.dtype == torch.bool:
        return bool(torch.equal(a, b)), 0.0 if torch.equal(a, b) else math.inf
    same_nan = torch.equal(a.isnan(), b.isnan())
    x, y = a.nan_to_num().double(), b.nan_to_num().double()
    diff = float(((x - y).abs() / y.abs().clamp(min=1e-300)).max()) if x.numel() else 0.0
    return bool(same_nan and (torch.equal(x, y) if exact else True)), diff


@dataclass(frozen=True)
class Row:
    case: Case
    torch_s: float
    ours_s: float
    equal: bool
    difference: float


def measure(scale: int = 1, rounds: int = 11, calls: int = 5) -> list[Row]:
    """Each case's two ways in alternating blocks of ``calls`` calls, ``rounds`` times; medians."""
    torch.set_num_threads(1)
    out = []
    for case in cases(scale):
        equal, difference = compare(case.ours(), case.torch_way(), case.exact)
        for fn in (case.torch_way, case.ours):  # warm: the first call of each allocates
            fn()
        mine, theirs = [], []
        for r in range(rounds):
            pair = [(case.torch_way, theirs), (case.ours, mine)]
            for fn, into in pair if r % 2 == 0 else reversed(pair):
                into.append(_time(fn, calls))
        out.append(Row(case, statistics.median(theirs), statistics.median(mine), equal, difference))
    return out


def table(rows: list[Row]) -> str:
    lines = [
        "| reading | tensors | torch's way | the debugger's | ratio | same answer |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        same = ("yes, bit for bit" if row.case.exact else f"to {row.difference:.1e} relative") if row.equal else "NO"
        lines.append(
            f"| {row.case.what} | {row.case.tensors} | {row.torch_s * 1e6:.0f} us | {row.ours_s * 1e6:.0f} us | "
            f"{row.torch_s / row.ours_s:.1f}x | {same} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reductions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=11, help="alternating blocks of each way (default 11)")
    args = parser.parse_args(argv)
    rows = measure(rounds=args.rounds)
    print(f"torch {torch.__version__}, 1 thread, median of {args.rounds} rounds; {load_average()}\n")
    print(table(rows))
    return 0 if all(row.equal for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
