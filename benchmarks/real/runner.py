"""Running cases: in worker processes (one torch thread each), plain for the ground truth or under NeuralDBG."""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def quiet_worker() -> None:
    """One thread per process (the machine has 2 cores), and no framework chatter."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import torch

    torch.set_num_threads(1)


def plain_task(case_id: str, seed: int, probe: bool) -> dict[str, Any]:
    quiet_worker()
    from .programs import case
    from .truth import train_plain

    return train_plain(case(case_id), seed, probe)


def neuraldbg_task(case_id: str, observe_loss: bool) -> dict[str, Any]:
    """One case under NeuralDBG, seed 0 (the ground truth's probed seed: the same run)."""
    quiet_worker()
    from .core import Session
    from .programs import case

    c = case(case_id)
    session = Session("neuraldbg", observe_loss=observe_loss)
    hp = c.program.settings(c.variant, 0)
    start = time.perf_counter()
    error = None
    metric = float("nan")
    try:
        metric = float(c.program.train(hp, session)["metric"])
    except Exception:
        error = traceback.format_exc(limit=3).strip().splitlines()[-1]
    seconds = time.perf_counter() - start
    hypotheses = []
    for h in session.hypotheses():
        hypotheses.append(
            {
                "kind": h.kind.value,
                "layer": h.root.layer,
                "step": h.root.step_start,
                "confidence": round(float(h.confidence), 3),
                "summary": h.summary(),
                "explanation": h.explanation,
            }
        )
    losses = session.losses
    tail = losses[-max(5, len(losses) // 10) :] if losses else []
    return {
        "id": case_id,
        "hypotheses": hypotheses,
        "metric": metric,
        "loss_last": tail[-1] if tail else math.nan,
        "steps": [dbg.steps for dbg in session.debuggers],
        "seconds": round(seconds, 2),
        "error": error,
    }


def run_all(
    task: Callable[..., dict[str, Any]], args: Iterable[tuple[Any, ...]], jobs: int
) -> Iterator[dict[str, Any]]:
    """Run ``task(*a)`` for each ``a``, in ``jobs`` spawned processes (in this one when jobs is 1), yielding
    results as they finish."""
    args = list(args)
    if jobs <= 1:
        for a in args:
            yield task(*a)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=quiet_worker) as pool:
        futures = [pool.submit(task, *a) for a in args]
        for future in futures:
            yield future.result()
