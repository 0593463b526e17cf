"""A user's training script, started with ``torchrun --nproc_per_node=2 torchrun_train.py OUT_DIR [dead]``.

Each rank trains its shard under DDP with NeuralDbg and saves its own trace; rank 0 prints the job's merged
diagnosis. Run by ``test_torchrun.py``; also the torchrun example of docs/distributed.md.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from neuraldbg import NeuralDbg


def main(out_dir: str, dead: bool) -> None:
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    if dead:
        with torch.no_grad():
            model[2].bias.fill_(-10.0)
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)  # each rank its own shard
    with NeuralDbg(ddp) as dbg:
        for _ in range(30):
            x = torch.randn(32, 16, generator=g)
            optimizer.zero_grad()
            nn.functional.mse_loss(ddp(x), x[:, :1]).backward()
            optimizer.step()
    dbg.save(os.path.join(out_dir, f"run.rank{rank}.json"))
    if dbg.job is not None:  # rank 0: every rank's findings, merged
        print(dbg.job.report())
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], "dead" in sys.argv[2:])
