"""NeuralDbg: wires hooks -> recorder -> detectors -> events -> reasoning around an unmodified training loop.

::

    with NeuralDbg(model) as dbg:
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss_fn(model(inputs), targets).backward()
            optimizer.step()
    print(dbg.explain_failure())

The debugger never changes the run it observes: it reads tensors under ``torch.no_grad()``, returns nothing
from its hooks, consumes no random numbers, and removes every hook when the block exits, whatever the exit.
Its own failures become :class:`~neuraldbg.errors.NeuralDbgWarning` s.

Under ``torch.distributed`` each rank watches its own process; when the block exits, the ranks' summaries are
gathered to rank 0 and merged into one diagnosis of the job (``dbg.job``, see :mod:`neuraldbg.distributed`).
"""

from __future__ import annotations

import math
import platform
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .analysis.analyzer import Analyzer
from .capture.recorder import Recorder
from .config import ENGINE_KEYWORDS, DebugConfig, make_config
from .distributed.process import ProcessInfo, process_info
from .errors import ConfigError, NeuralDbgError, NeuralDbgWarning
from .events import SemanticEvent
from .kinds import loss_evidence
from .model import naming
from .model.info import LayerInfo
from .model.layers import describe
from .plugins import manager
from .queries import Queries
from .reasoning import CausalRule, Topology
from .reasoning.topology import call_positions
from .version import __version__

if TYPE_CHECKING:
    from .distributed.job import JobRun


class NeuralDbg(Queries):
    """Watch a model's training and explain what went wrong.

    Args:
        model: the ``nn.Module`` being trained. When you compile, pass the ``torch.compile`` d module: it is
            unwrapped for layer names, and the debugger keeps its step bookkeeping out of the compiled graph.
        config: a :class:`~neuraldbg.DebugConfig` or a mapping of its fields.
        preset: ``"default"``, ``"full"`` (full statistics every step) or ``"economy"``.
        plugins: extra plugins (see :mod:`neuraldbg.plugins.hookspecs`) for this debugger only.
        grad_scaler: the ``torch.amp.GradScaler`` of a mixed-precision loop. Statistics are read unscaled, the
            steps it skips are counted (not diagnosed as non-finite) and a collapsing scale is diagnosed. Without
            it the scaler is looked for at the first optimizer steps (see :mod:`neuraldbg.capture.scaler`); pass
            it when its first steps may all be skipped.
        gather: under ``torch.distributed`` with several ranks, send this rank's findings to rank 0 when the
            block exits, where they are merged into ``dbg.job`` (every rank must then leave its block). False
            leaves it to ``dbg.gather()``.
        gather_timeout: seconds rank 0 waits for the other ranks' findings; a rank that has not sent them by
            then is named as missing and the job is not verified healthy.
        **options: any :class:`~neuraldbg.DebugConfig` field, e.g. ``persistence=5``.
    """

    def __init__(
        self,
        model: nn.Module,
        config: DebugConfig | Mapping[str, Any] | None = None,
        *,
        preset: str | None = None,
        plugins: Iterable[Any] = (),
        grad_scaler: Any = None,
        gather: bool = True,
        gather_timeout: float = 60.0,
        **options: Any,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ConfigError(f"NeuralDbg(): expected a torch.nn.Module, got {type(model).__name__}")
        self.config = make_config(config, preset, "NeuralDbg()", ENGINE_KEYWORDS, **options)
        _check_distributed_options(grad_scaler, gather, gather_timeout)
        self._gather, self._gather_timeout = gather, float(gather_timeout)
        self._process: ProcessInfo | None = process_info()
        self.job: JobRun | None = None  #: the job's merged diagnosis, on rank 0 after the block (else None)
        self._gathered = False
        self._depth = 0  # ``with`` blocks of this debugger entered and not yet left
        root = getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule wraps the real module
        if not isinstance(root, nn.Module):
            root = model
        self._model = weakref.ref(root)
        self._model_class = naming.class_name(naming.unwrap(root))
        self._compiled = root is not model
        self._infos: dict[str, LayerInfo] = describe(root, self.config.saturation_derivative)
        pm = _plugin_manager(plugins)
        self._rules: list[CausalRule] = manager.rules(pm)
        order: list[tuple[str, int]] = []  # one list: the recorder appends, the detectors read
        detectors = manager.detectors(pm, self.config)
        kinds = manager.kinds_of(pm)
        self._kinds = [k.name for k in kinds]
        self._analyzer = Analyzer(self.config, self._infos, order, detectors, kinds)
        self._recorder = Recorder(root, self._infos, self.config, self._analyzer.consume, order, grad_scaler)
        self._analyzer.watch_coverage(self._recorder.coverage, self._recorder.run_facts)
        self.history = self._analyzer.history

    # --- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> NeuralDbg:
        """Attach (unless already attached: ``with watch(model) as dbg:``). Blocks of one debugger may nest
        (``with dbg:`` inside ``with dbg:``, a helper that opens its own block): they are counted, and only the
        outermost block's exit detaches, so the steps after an inner block are watched too."""
        if not self.attached:
            self.attach()
        self._depth += 1
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            self._close(exc)  # the user's exception, if any, propagates unchanged

    def attach(self) -> NeuralDbg:
        """Install the hooks (done by ``with``); attaching again after ``close()`` continues the same run."""
        if self.attached:
            raise NeuralDbgError("NeuralDbg is already attached to this model; use one `with` block at a time")
        if self._model() is None:
            raise NeuralDbgError("NeuralDbg: the model was garbage-collected; keep a reference while training")
        self._recorder.attach()
        self._process = process_info() or self._process
        self._gathered = False
        return self

    @property
    def model(self) -> nn.Module | None:
        """The watched model (the module inside a ``torch.compile`` wrapper), or None once it was collected."""
        return self._model()

    @property
    def attached(self) -> bool:
        return self._recorder.attached

    def close(self) -> None:
        """Finish the step in progress and remove every hook. Safe to call twice. Under ``torch.distributed``
        (several ranks, ``gather=True``) this rank's findings are then sent to rank 0 (see :meth:`gather`)."""
        self._close(None)

    def _close(self, exc: BaseException | None) -> None:
        self._depth = 0  # close() inside a block ends it: its exit has nothing left to detach
        was_attached = self.attached
        try:
            self._recorder.detach()
        finally:
            if was_attached and self._gather and not self._gathered:
                # a rank leaving with an exception still sends its findings, and waits for nobody: the others may
                # be stuck in a collective it will never join (rank 0 merges what has already arrived)
                note = f"left its NeuralDbg block with {type(exc).__name__}: {exc}" if exc is not None else ""
                self._send(self._gather_timeout if exc is None else 0.0, note)

    def gather(self, timeout: float | None = None) -> JobRun | None:
        """Send this rank's findings to rank 0 and, on rank 0, merge every rank's into one diagnosis of the job.

        Every rank must call it (the n-th call of each rank meets the n-th of the others); rank 0 waits at most
        ``timeout`` seconds (default: ``gather_timeout``) and names the ranks that sent nothing. Returns the
        :class:`~neuraldbg.distributed.job.JobRun` on rank 0 (also kept as ``dbg.job``), None on the other ranks
        and outside a distributed job. A failure to communicate becomes a NeuralDbgWarning; it raises only
        ``ConfigError`` for a timeout that is not a positive number of seconds.
        """
        if timeout is not None:
            _check_distributed_options(None, True, timeout, "gather(timeout=...)")
        return self._send(self._gather_timeout if timeout is None else float(timeout), "")

    def _send(self, timeout: float, note: str) -> JobRun | None:
        from .distributed import gather
        from .distributed.job import JobRun

        self._gathered = True
        info = process_info() or self._process
        if info is None or info.world_size < 2:
            return None
        try:
            from .distributed.merge import summarize

            summary = summarize(self, rank=info.rank, world_size=info.world_size)
            received = gather.send(summary, timeout=timeout, note=note, info=info)
            if received is None:
                return None
            if received.reasons:
                warnings.warn(
                    "NeuralDBG: "
                    + "; ".join(f"rank {r} {why}" for r, why in sorted(received.reasons.items()))
                    + ". The job's diagnosis names it as missing.",
                    NeuralDbgWarning,
                    stacklevel=3,
                )
            self.job = JobRun(self, received)
            return self.job
        except Exception as exc:  # the job's training goes on; only the merged diagnosis is lost
            warnings.warn(
                f"NeuralDBG could not gather the ranks' findings on rank {info.rank}: {exc!r}. Each rank's own "
                "diagnosis is unaffected; save per-rank traces and merge them with `neuraldbg explain`.",
                NeuralDbgWarning,
                stacklevel=3,
            )
            return None

    # --- manual control ------------------------------------------------------------------------------

    def step(self) -> None:
        """Mark the end of a training step yourself (then only ``step()`` counts steps)."""
        self._recorder.manual_step()

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Record the step's loss (optional: every detector works without it).

        Call it once per step, any time between the forward pass and the next step's forward pass (before or
        after ``backward()`` and ``optimizer.step()``); it is attributed to the step in progress.
        """
        if isinstance(loss, torch.Tensor):
            self._recorder.observe_loss(loss)

    # --- state ---------------------------------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Training steps observed so far."""
        return self._analyzer.steps_observed + len(self._recorder.buffer)

    @property
    def step_mode(self) -> str:
        """How steps are counted: "optimizer", "backward", "manual" (or "unknown" before the first step)."""
        return self._recorder.mode.value

    def _current(self) -> tuple[list[SemanticEvent], Topology, Sequence[CausalRule]]:
        if self._recorder.mode.value != "unknown" or not self.attached:
            self._recorder.flush()
        order = self._analyzer.layer_order()
        topo = Topology(
            order=order,
            types={n: i.type_name for n, i in self._infos.items()},
            roles={n: i.role.value for n, i in self._infos.items()},
            first_step=0,
            last_step=self._analyzer.last_step,
            calls=call_positions(self._analyzer.ctx.order, order),
        )
        return self._analyzer.events(final=not self.attached), topo, self._rules

    def checked_kinds(self) -> list[str]:
        """The names of the failure kinds this debugger checks: the built-in ones and its plugins'."""
        return list(self._kinds)

    def _meta(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        info = self._process
        if info is not None:
            extra.update(rank=info.rank, world_size=info.world_size, backend=info.backend)
        scaler = self._recorder.coverage.scaler
        if scaler is not None:
            extra["grad_scaler"] = scaler.facts()
        moved = loss_evidence.unjudged_moves(self._recorder.coverage, self.config)
        if moved is not None:  # its loss stayed where it began, or at a guess, after too little training to say why
            extra["loss_unjudged_moved"] = moved
        return {
            **extra,
            "model": self._model_class,
            "compiled": self._compiled,
            "steps_observed": self._analyzer.steps_observed,
            "losses_recorded": self._recorder.coverage.losses.count,
            "full_steps": self._analyzer.full_steps,
            "last_step": self._analyzer.last_step,
            "step_mode": self.step_mode,
            "config": self.config.as_dict(),
            "events_dropped": self._analyzer.tracker.store.dropped,
            "layers": [
                {
                    "name": i.name,
                    "type": i.type_name,
                    "role": i.role.value,
                    "params": list(i.params),
                    "numel": i.numel,
                }
                for i in self._infos.values()
            ],
            "torch_version": str(torch.__version__),  # TorchVersion is a str subclass that serialisers reject
            "python_version": platform.python_version(),
            "neuraldbg_version": __version__,
        }

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        return f"<NeuralDbg {self._model_class} {state}, {self.steps} steps, mode {self.step_mode}>"


def watch(model: nn.Module, config: DebugConfig | Mapping[str, Any] | None = None, **options: Any) -> NeuralDbg:
    """Start watching ``model`` now; call ``.close()`` when done (or use the result in a ``with`` block)."""
    return NeuralDbg(model, config, **options).attach()


def _check_distributed_options(
    grad_scaler: Any, gather: Any, timeout: Any, where: str = "NeuralDbg(gather_timeout=...)"
) -> None:
    from .capture.scaler import is_grad_scaler

    if grad_scaler is not None and not is_grad_scaler(grad_scaler):
        raise ConfigError(
            f"NeuralDbg(grad_scaler=...): expected a torch.amp.GradScaler, got {type(grad_scaler).__name__}"
        )
    if not isinstance(gather, bool):
        raise ConfigError(f"NeuralDbg(gather=...): expected true or false, got {gather!r}")
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not (math.isfinite(timeout) and timeout > 0)
    ):
        raise ConfigError(f"{where}: expected a positive number of seconds, got {timeout!r}")


def _plugin_manager(extra: Iterable[Any]) -> Any:
    try:
        return manager.manager(extra)
    except ConfigError:  # a plugin given or built wrongly: its own message names it and what was expected
        raise
    except Exception as exc:  # a broken third-party plugin is reported before training starts
        raise NeuralDbgError(f"NeuralDbg: loading plugins failed: {exc!r}") from exc
