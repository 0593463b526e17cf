"""Distributed smoke tests: train briefly on several CPU processes (gloo) and gate on the job's one diagnosis.

::

    from pytest_neuraldbg import assert_healthy
    from pytest_neuraldbg.distributed import smoke_train

    def make_model():                       # module level: each rank builds its own copy
        return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def shard(rank, world_size):            # each rank's batches
        g = torch.Generator().manual_seed(rank)
        return [(torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)) for _ in range(8)]

    def test_ddp_training_is_healthy():
        job = smoke_train(make_model, shard, nn.functional.mse_loss, world_size=2, wrap="ddp", steps=30)
        assert_healthy(job)                 # fails naming the ranks that show each failure

:func:`smoke_train` starts ``world_size`` fresh Python processes, joins them in a gloo process group, trains the
model under ``NeuralDbg`` on each and returns the job's merged diagnosis
(:class:`~neuraldbg.distributed.job.JobRun`: the query API of a run, which every assertion helper takes).
:func:`spawn` is the primitive beneath it: run any module-level function on each rank and collect what it
returns.

Robust on a small CI machine, with or without pytest-xdist: the ranks meet through a file in a fresh temporary
directory (no TCP port is chosen, so parallel workers cannot collide), each rank uses one thread, the process
group's own timeout is the run's, and every process is reaped: on the deadline the ranks still running are
terminated, then killed. A rank that fails or hangs does not hang the others; the diagnosis names it.

Functions and data given to the ranks travel by pickle into new processes: module-level functions (of a test
module too), ``functools.partial`` of them, picklable objects; not lambdas or functions defined inside a test.
This module imports torch only when called.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import islice
from typing import Any

from .errors import PluginError

#: Seconds a terminated rank gets to exit before it is killed.
_GRACE = 5.0


@dataclass
class RankOutcome:
    """How one rank ended: its exit code (None: still running at the deadline), its error, its result."""

    rank: int
    exitcode: int | None
    error: str = ""  # the traceback of an exception the rank's function raised
    timed_out: bool = False
    result: Any = None

    @property
    def ok(self) -> bool:
        return self.exitcode == 0 and not self.error and not self.timed_out

    def describe(self) -> str:
        if self.timed_out:
            return f"rank {self.rank} was still running at the deadline and was stopped"
        if self.error:
            last = self.error.strip().splitlines()[-1] if self.error.strip() else "an exception"
            return f"rank {self.rank} failed: {last}"
        if self.exitcode != 0:
            return f"rank {self.rank} exited with code {self.exitcode}"
        return f"rank {self.rank} finished"


class DistributedRunError(PluginError, RuntimeError):
    """Some ranks of a :func:`spawn` run failed or timed out; ``outcomes`` says how each rank ended."""

    def __init__(self, message: str, outcomes: list[RankOutcome]) -> None:
        super().__init__(message)
        self.outcomes = outcomes


@dataclass
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    world_size: int
    directory: str
    timeout: float
    env: dict[str, str] = field(default_factory=dict)


def spawn(fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout: float = 300.0) -> list[RankOutcome]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` new processes in one gloo process group.

    Each rank's return value must be JSON data (it comes back in :attr:`RankOutcome.result`). Returns every
    rank's outcome in rank order, also when some failed (see :attr:`RankOutcome.ok`); raises ``TypeError`` when
    ``fn`` or ``args`` cannot be sent to a new process. ``timeout``: seconds for the whole run, after which the
    ranks still running are stopped (and the process group's collectives time out).
    """
    _check_positive("world_size", world_size, integer=True)
    _check_positive("timeout", timeout)
    directory = tempfile.mkdtemp(prefix="neuraldbg-ranks-")
    try:
        job = _Job(fn, args, int(world_size), directory, float(timeout), _rank_env())
        try:
            pickle.dumps(job)
        except Exception as exc:
            raise TypeError(
                f"spawn(): {getattr(fn, '__qualname__', fn)!r} and its arguments must be picklable to reach the "
                f"ranks' processes (module-level functions, not lambdas or local functions): {exc}"
            ) from exc
        return _run(job)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _rank_env() -> dict[str, str]:
    """Environment of the ranks: one thread each (two ranks on two cores, maybe under xdist), unless set."""
    keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
    return {key: os.environ.get(key, "1") for key in keys}


def _run(job: _Job) -> list[RankOutcome]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    saved = {key: os.environ.get(key) for key in job.env}
    os.environ.update(job.env)  # inherited by the processes started now
    processes = []
    try:
        for rank in range(job.world_size):
            # not daemonic: a rank may start DataLoader workers; every rank is reaped below all the same
            process = ctx.Process(target=_rank_main, args=(rank, job), name=f"neuraldbg-rank-{rank}")
            process.start()
            processes.append(process)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        deadline = time.monotonic() + job.timeout
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        stopped = [p for p in processes if p.is_alive()]
        for process in stopped:
            process.terminate()
        for process in stopped:
            process.join(_GRACE)
            if process.is_alive():
                process.kill()
                process.join()
    outcomes = []
    for rank, process in enumerate(processes):
        outcome = RankOutcome(rank, None if process in stopped else process.exitcode, timed_out=process in stopped)
        error_path = os.path.join(job.directory, f"error.rank{rank}.txt")
        if os.path.exists(error_path):
            with open(error_path, encoding="utf-8") as fh:
                outcome.error = fh.read()
        result_path = os.path.join(job.directory, f"result.rank{rank}.json")
        if os.path.exists(result_path):
            with open(result_path, encoding="utf-8") as fh:
                outcome.result = json.load(fh)
        outcomes.append(outcome)
    return outcomes


def _rank_main(rank: int, job: _Job) -> None:
    """A rank's process: join the group, run the function, write its result (or its error), leave the group."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    code = 0
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{os.path.join(job.directory, 'rendezvous')}",
            rank=rank,
            world_size=job.world_size,
            timeout=timedelta(seconds=job.timeout),
        )
        try:
            result = job.fn(rank, job.world_size, *job.args)
            _write(os.path.join(job.directory, f"result.rank{rank}.json"), json.dumps(result, allow_nan=False))
        finally:
            dist.destroy_process_group()
    except BaseException:
        _write(os.path.join(job.directory, f"error.rank{rank}.txt"), traceback.format_exc())
        code = 1
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)  # no atexit or finaliser of a half-torn-down process group can hang the exit


def _write(path: str, text: str) -> None:
    from neuraldbg.export.files import write_atomic

    write_atomic(path, text)


def _check_positive(name: str, value: Any, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        expected = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{name} must be {expected}, got {value!r}")


# --- the distributed smoke test -----------------------------------------------------------------------------


@dataclass
class _Smoke:
    model: Any  # an nn.Module (pickled to each rank) or a callable building one
    data: Any  # callable (rank, world_size) -> data, or data shared round-robin
    loss_fn: Callable[[Any, Any], Any]
    wrap: Any
    optimizer: Any
    steps: int
    seed: int
    gather_timeout: float
    config: Any
    preset: str | None
    options: dict[str, Any]


WRAPS = ("ddp", "fsdp", "fully_shard", "none")


def smoke_train(
    model: Any,
    data: Any,
    loss_fn: Callable[[Any, Any], Any],
    *,
    world_size: int = 2,
    wrap: str | Callable[[Any], Any] = "ddp",
    optimizer: Any = None,
    steps: int = 50,
    seed: int = 0,
    timeout: float = 300.0,
    gather_timeout: float = 60.0,
    config: Any = None,
    preset: str | None = None,
    **options: Any,
) -> Any:
    """Train on ``world_size`` gloo processes under ``NeuralDbg`` and return the job's merged diagnosis.

    Args:
        model: an ``nn.Module`` (each rank gets a copy) or a module-level function building one (called on each
            rank after ``torch.manual_seed(seed)``, so every rank starts from the same weights).
        data: a module-level function ``(rank, world_size) -> data`` giving each rank its shard (any data
            ``smoke_train`` takes: a list of ``(inputs, targets)``, a DataLoader, a function ``step -> batch``);
            or one iterable of batches, dealt round-robin (rank ``r`` gets batches ``r, r + world_size, ...``).
        loss_fn: ``loss_fn(model(inputs), targets)``; module level or a picklable object.
        wrap: ``"ddp"`` (DistributedDataParallel), ``"fsdp"`` (FullyShardedDataParallel), ``"fully_shard"``
            (FSDP2: each child holding parameters, then the model), ``"none"``, or a module-level function
            ``model -> wrapped model``.
        optimizer: None (Adam, lr 1e-3) or a module-level function ``params -> optimizer``.
        steps, seed: as for the fixture's ``smoke_train``.
        timeout: seconds for the whole run (the ranks still running then are stopped).
        gather_timeout: seconds rank 0 waits for the other ranks' findings.
        config, preset, **options: the engine's configuration, as for ``NeuralDbg``.

    Returns a :class:`~neuraldbg.distributed.job.JobRun`. A rank that failed or hung is named as missing in it
    (its failure in ``job.report()``); raises :class:`DistributedRunError` when rank 0 itself produced no
    diagnosis, with every rank's traceback.
    """
    if not (callable(wrap) or wrap in WRAPS):
        raise ValueError(f"smoke_train(): wrap must be one of {', '.join(WRAPS)} or a function, got {wrap!r}")
    _check_positive("steps", steps, integer=True)
    _check_positive("gather_timeout", gather_timeout)
    _check_engine_options(config, preset, options)
    spec = _Smoke(
        model, data, loss_fn, wrap, optimizer, int(steps), int(seed), float(gather_timeout), config, preset, options
    )
    results_dir = tempfile.mkdtemp(prefix="neuraldbg-job-")
    try:
        outcomes = spawn(_smoke_rank, spec, results_dir, world_size=world_size, timeout=timeout)
        return _job(outcomes, results_dir, world_size)
    finally:
        shutil.rmtree(results_dir, ignore_errors=True)


#: ``smoke_train``'s keywords, and those it hands to ``NeuralDbg()`` as they are (not DebugConfig fields).
_KEYWORDS = ("model", "data", "loss_fn", "world_size", "wrap", "optimizer", "steps", "seed", "timeout")


def _check_engine_options(config: Any, preset: str | None, options: dict[str, Any]) -> None:
    """A misspelt engine option or preset fails here, in the calling process, naming ``smoke_train()`` and the
    closest valid name, rather than in every rank's traceback."""
    from neuraldbg.config import ENGINE_KEYWORDS, make_config

    given = {key: value for key, value in options.items() if key not in ENGINE_KEYWORDS}
    make_config(config, preset, "smoke_train()", (*_KEYWORDS, *ENGINE_KEYWORDS), **given)


def _smoke_rank(rank: int, world_size: int, spec: _Smoke, results_dir: str) -> dict[str, Any]:
    import torch
    from torch import nn

    from neuraldbg import NeuralDbg

    from . import smoke

    torch.manual_seed(spec.seed)
    model = spec.model if isinstance(spec.model, nn.Module) else spec.model()
    wrapped = _wrap(model, spec.wrap)
    dbg = NeuralDbg(wrapped, spec.config, preset=spec.preset, gather_timeout=spec.gather_timeout, **spec.options)
    data = spec.data(rank, world_size) if callable(spec.data) else _deal(spec.data, rank, world_size)
    smoke.train(dbg, wrapped, data, spec.loss_fn, optimizer=spec.optimizer, steps=spec.steps, seed=spec.seed)
    dbg.save(os.path.join(results_dir, f"run.rank{rank}.json"))
    if dbg.job is not None:
        _write(os.path.join(results_dir, "gathered.json"), json.dumps(dbg.job.gathered.to_json()))
    return {"steps": dbg.steps}


def _wrap(model: Any, wrap: Any) -> Any:
    if callable(wrap):
        return wrap(model)
    if wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    if wrap == "fsdp":
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel

        on_cpu = all(p.device.type == "cpu" for p in model.parameters())
        return FullyShardedDataParallel(model, device_id=torch.device("cpu") if on_cpu else None)
    if wrap == "fully_shard":
        from torch.distributed.fsdp import fully_shard

        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child)
        fully_shard(model)
    return model


def _deal(data: Iterable[Any], rank: int, world_size: int) -> Iterator[Any]:
    """Rank ``rank``'s share of one stream of batches: every ``world_size``-th, from the ``rank``-th."""
    from . import smoke

    return islice(smoke.batches(data), rank, None, world_size)


def _job(outcomes: list[RankOutcome], results_dir: str, world_size: int) -> Any:
    """The job's diagnosis from what the ranks left: rank 0's trace and what it gathered."""
    from neuraldbg import load
    from neuraldbg.distributed.gather import Gathered
    from neuraldbg.distributed.job import JobRun

    gathered_path = os.path.join(results_dir, "gathered.json")
    trace_path = os.path.join(results_dir, "run.rank0.json")
    if not (os.path.exists(gathered_path) and os.path.exists(trace_path)):
        details = "\n\n".join(
            f"{o.describe()}" + (f":\n{o.error.rstrip()}" if o.error else "") for o in outcomes if not o.ok
        )
        raise DistributedRunError(
            f"smoke_train(): rank 0 produced no diagnosis of the job.\n{details or 'every rank finished'}", outcomes
        )
    with open(gathered_path, encoding="utf-8") as fh:
        gathered = Gathered.from_json(json.load(fh))
    for outcome in outcomes:
        if not outcome.ok:
            gathered.notes[outcome.rank] = outcome.describe()
    return JobRun(load(trace_path), gathered)
