"""Where this process stands in a distributed job: rank, world size and backend."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands in a distributed job."""

    rank: int
    world_size: int
    backend: str


def process_info() -> ProcessInfo | None:
    """Rank, world size and backend of the default process group; None when ``torch.distributed`` is not
    initialised (or not built in)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        backend = str(dist.get_backend())
    except Exception:  # a backend torch cannot name (a third-party one)
        backend = "unknown"
    return ProcessInfo(int(dist.get_rank()), int(dist.get_world_size()), backend)
