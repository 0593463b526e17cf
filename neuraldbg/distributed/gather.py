"""One diagnosis for the job: each rank's bounded summary sent to rank 0, merged there, with a timeout.

At the end of a ``NeuralDbg`` block (or on ``dbg.gather()``) every rank reduces its diagnosis to a summary
(:func:`neuraldbg.distributed.merge.summarize`: plain JSON data, at most a few dozen findings, no tensors) and rank 0
merges the summaries (:func:`neuraldbg.distributed.merge.merge`) into one diagnosis that says which ranks show each
failure.

Transport: the key-value store of the default process group, the ``torch.distributed`` Store every process group
is built on (a TCPStore under ``torchrun`` or ``env://``, a FileStore under ``file://``). Each rank ``set`` s its
summary under a key of its own and adds one to a counter; rank 0 polls the counter, then reads each rank's key,
until every rank has answered or the timeout has passed. Not an object collective, on purpose:

* a collective blocks until every rank joins it and fails as a whole: it cannot name the rank that did not come,
  and a rank that failed (and so never joins) would keep the others waiting for the process group's timeout
  (30 minutes by default) - here only rank 0 waits, for at most ``timeout`` seconds, and names each missing rank;
* a collective issued on the training's process group while another rank is still inside one of the training's
  collectives (a rank that left its block early, with an exception) mismatches them: a hang, or worse, data
  exchanged between the wrong operations. Store keys never meet the training's traffic;
* a rank that leaves its block with an exception still sends its summary, without waiting for anyone.

Keys are numbered per process (the n-th gather of every rank meets the n-th of the others) and rank 0 deletes
what it read. Cost: one JSON encoding and two store round trips per rank, and on rank 0 one read per rank plus
polling: a few milliseconds per block on rank 0, under one on the others (``python -m benchmarks.gather``).
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from .process import ProcessInfo, process_info

#: Bytes of one rank's summary, at most (a summary is bounded far below this; anything larger is refused).
MAX_BYTES = 4 << 20
_PREFIX = "neuraldbg/gather"
_counter = itertools.count()  # gathers made by this process


@dataclass
class Gathered:
    """What rank 0 received: each rank's summary, why the others sent none, and what ranks said of themselves."""

    world_size: int
    summaries: dict[int, dict[str, Any]]
    reasons: dict[int, str] = field(default_factory=dict)  # rank -> why it has no summary
    notes: dict[int, str] = field(default_factory=dict)  # rank -> what it said about how its block ended
    seconds: float = 0.0  # rank 0's wait

    def to_json(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "summaries": {str(r): s for r, s in sorted(self.summaries.items())},
            "reasons": {str(r): s for r, s in sorted(self.reasons.items())},
            "notes": {str(r): s for r, s in sorted(self.notes.items())},
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Gathered:
        return cls(
            int(data["world_size"]),
            {int(r): s for r, s in data["summaries"].items()},
            {int(r): str(s) for r, s in data.get("reasons", {}).items()},
            {int(r): str(s) for r, s in data.get("notes", {}).items()},
            float(data.get("seconds", 0.0)),
        )


def default_store() -> Any:
    """The Store of the default process group (None when torch does not expose it)."""
    import torch.distributed as dist

    getter = getattr(dist.distributed_c10d, "_get_default_store", None)
    return getter() if callable(getter) else None


def send(
    summary: dict[str, Any], *, timeout: float, note: str = "", info: ProcessInfo | None = None
) -> Gathered | None:
    """Send this rank's summary; on rank 0, wait up to ``timeout`` seconds for the others' and return them all.
    Other ranks return None at once. Raises only for a store that cannot be reached (the caller warns)."""
    info = info or process_info()
    if info is None or info.world_size < 2:
        return None
    store = default_store()
    if store is None:
        raise RuntimeError("this torch does not expose the process group's store")
    base = f"{_PREFIX}/{next(_counter)}"
    if info.rank != 0:
        payload = json.dumps({"summary": summary, "note": note}, allow_nan=False).encode()
        if len(payload) > MAX_BYTES:
            payload = json.dumps({"summary": None, "note": f"its summary was larger than {MAX_BYTES} bytes"}).encode()
        store.set(f"{base}/{info.rank}", payload)
        store.add(f"{base}/count", 1)
        return None
    return _receive(store, base, info.world_size, summary, note, timeout)


def _receive(store: Any, base: str, world_size: int, own: dict[str, Any], note: str, timeout: float) -> Gathered:
    start = time.monotonic()
    deadline = start + timeout
    others = world_size - 1
    pause = 0.005
    while store.add(f"{base}/count", 0) < others:  # timeout 0: take what has already arrived
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.2)
    out = Gathered(world_size, {0: own}, notes={0: note} if note else {})
    for rank in range(1, world_size):
        key = f"{base}/{rank}"
        if not store.check([key]):
            out.reasons[rank] = (
                f"sent no summary within {timeout:g} s (it failed, hung, or left its block later)"
                if timeout > 0
                else "had sent no summary when rank 0 left its block with an exception"
            )
            continue
        try:
            message = json.loads(store.get(key).decode())
            summary = message.get("summary")
            if message.get("note"):
                out.notes[rank] = str(message["note"])[:2000]
        except (ValueError, AttributeError, UnicodeDecodeError) as exc:
            summary = None
            out.reasons[rank] = f"sent a summary that could not be read ({exc.__class__.__name__})"
        if summary is not None:
            out.summaries[rank] = summary
        elif rank not in out.reasons:
            out.reasons[rank] = f"sent no summary: {out.notes.get(rank, 'it had none')}"
        _delete(store, key)
    _delete(store, f"{base}/count")
    out.seconds = time.monotonic() - start
    return out


def _delete(store: Any, key: str) -> None:
    try:
        store.delete_key(key)
    except Exception:  # a store without deletion (or a key already gone): a few bytes stay behind
        return
