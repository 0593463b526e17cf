"""Small CPU runs standing in for the ranks of a data-parallel job, and their saved traces.

Every "rank" builds the same model from the same seed (as DDP does) and reads its own shard of the data (its own
generator); a rank may be given a poisoned batch. Ground truth is in the setup: the dead layer is made dead by a
bias of -10 on the Linear before it (no unit of '3' can be positive), and the poisoned batch holds a NaN.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

POISON_STEP = 12


def rank_run(rank: int, *, dead: bool = True, poison_step: int | None = None, steps: int = 30) -> NeuralDbg:
    """One rank's training: the same model on every rank, its own data shard."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    if dead:
        with torch.no_grad():
            model[2].bias.fill_(-10.0)  # '3' (the ReLU after it) never sees a positive input
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    shard = torch.Generator().manual_seed(100 + rank)
    with NeuralDbg(model) as dbg:
        for step in range(steps):
            x = torch.randn(32, 16, generator=shard)
            y = x.sum(1, keepdim=True)
            if step == poison_step:
                x[0, 0] = float("nan")
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
    return dbg


def save_rank_trace(dbg: NeuralDbg, path: Path, **meta: Any) -> Path:
    """Save a rank's trace, adding ``meta`` fields (rank, world_size, backend) as a distributed run writes them."""
    doc = dbg.to_dict()
    doc["meta"].update(meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path
