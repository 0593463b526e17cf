"""What one diagnosis for a distributed job costs: the end of a watched block with and without the gather.

    python -m benchmarks.gather        # about a minute on 2 CPU cores

Two gloo ranks on this machine (processes spawned by ``pytest_neuraldbg.distributed.spawn``) train a DDP MLP;
each ends ``repeats`` short watched blocks with ``gather=True`` and as many with ``gather=False``, alternating.
Printed per rank: the median time to leave the block either way, the difference (the gather: one JSON encoding
and the store round trips; on rank 0 also the wait for the other rank and the merge), and the summary's size.
A healthy run and one with a dead layer (more findings to send) are measured.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from neuraldbg import NeuralDbg  # noqa: E402
from neuraldbg.distributed import merge as ranks  # noqa: E402
from pytest_neuraldbg.distributed import spawn  # noqa: E402


def _rank(rank: int, world_size: int, dead: bool, repeats: int) -> dict[str, float]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    if dead:
        with torch.no_grad():
            model[2].bias.fill_(-30.0)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(rank)
    exits: dict[bool, list[float]] = {True: [], False: []}
    size = 0
    for i in range(2 * repeats):
        gather = i % 2 == 0
        dbg = NeuralDbg(ddp, gather=gather)
        dbg.attach()
        for _ in range(20):
            opt.zero_grad()
            F.mse_loss(ddp(torch.randn(16, 32, generator=g)), torch.randn(16, 1, generator=g)).backward()
            opt.step()
        torch.distributed.barrier()  # both ranks leave their blocks together: the wait is not a straggler's
        t0 = time.perf_counter()
        dbg.close()
        exits[gather].append(time.perf_counter() - t0)
        size = len(json.dumps(ranks.summarize(dbg)))
    return {
        "with_ms": statistics.median(exits[True]) * 1e3,
        "without_ms": statistics.median(exits[False]) * 1e3,
        "summary_bytes": float(size),
    }


def main(argv: list[str] | None = None) -> int:
    repeats = 3 if argv and "--quick" in argv else 10
    print(f"torch {torch.__version__}, 2 gloo ranks, DDP MLP, 20 steps per block, {repeats} blocks each way")
    print()
    print("| run | rank | leaving the block, gather=False | gather=True | the gather | summary |")
    print("|---|---|---|---|---|---|")
    for label, dead in (("healthy", False), ("dead layer", True)):
        outcomes = spawn(_rank, dead, repeats, world_size=2, timeout=600)
        for outcome in outcomes:
            if not outcome.ok:
                print(f"rank {outcome.rank} failed: {outcome.error}", file=sys.stderr)
                return 1
            r = outcome.result
            print(
                f"| {label} | {outcome.rank} | {r['without_ms']:.1f} ms | {r['with_ms']:.1f} ms |"
                f" {r['with_ms'] - r['without_ms']:.1f} ms | {r['summary_bytes'] / 1024:.1f} KiB |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
