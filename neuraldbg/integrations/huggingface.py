"""NeuralDBG for ``transformers.Trainer``::

    from neuraldbg.integrations.huggingface import NeuralDbgTrainerCallback

    callback = NeuralDbgTrainerCallback()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    with callback:  # closes the debugger even when train() raises
        trainer.train()
    print(callback.debugger.report())

``NeuralDbgTrainerCallback`` is built on first use (this module imports no transformers) and raises
:class:`~neuraldbg.integrations.MissingExtraError` when ``transformers`` is not installed.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..errors import NeuralDbgWarning
from .callback import WatchedRun, require, verdict_metrics, verdict_text

__all__ = ["NeuralDbgTrainerCallback"]

if TYPE_CHECKING:  # built on first use, by __getattr__ below
    NeuralDbgTrainerCallback: Any


class TrainerAdapter:
    """Watch ``Trainer.train`` with NeuralDBG, as ``with NeuralDbg(model): trainer.train()`` would.

    The debugger is attached to the Trainer's model (``trainer.model``: the user's model, not the accelerate or
    DataParallel wrapper, so layer names are the model's own) when training begins and closed when it ends.
    Steps are the engine's: optimizer steps, which is ``state.global_step`` under ``gradient_accumulation_steps``,
    ``max_grad_norm`` and bf16; evaluation runs without gradients and is not observed.

    The verdict is appended to ``trainer.state.log_history`` (``neuraldbg/healthy``, ``neuraldbg/failures``,
    ``neuraldbg/steps`` at the last global step, so it lands in ``trainer_state.json``) and written to
    transformers' log: the verdict line at INFO when healthy, the full report as a warning when not. The
    reporting integrations (TensorBoard, W&B) do not see it: callbacks get no handle on ``trainer.log``.

    The Trainer calls no callback when ``train()`` raises; use the callback as a context manager around
    ``train()`` (or call :meth:`close`) to remove the hooks then. Under the ``neuraldbg`` fixture the fixture does
    it at the end of the test. A later ``train()`` with the same callback continues the run.

    Args:
        debugger: a :class:`~neuraldbg.NeuralDbg` for the model, not attached: the ``neuraldbg`` fixture's
            ``neuraldbg(model)`` makes the run part of the test's report, gate and baseline. None (the default)
            creates one for the Trainer's model.
        config, preset, plugins, **options: the engine's arguments for the debugger created here; not with
            ``debugger``.
        log: write the verdict to the log history and transformers' log (default True).

    After training, ``callback.debugger`` answers every question (``explain_failure()``, ``report()``, ``save()``).
    """

    def __init__(
        self,
        debugger: Any = None,
        *,
        config: Any = None,
        preset: str | None = None,
        plugins: Iterable[Any] = (),
        log: bool = True,
        **options: Any,
    ) -> None:
        super().__init__()
        self._run = WatchedRun(type(self).__name__ + "()", debugger, config, preset, plugins, options)
        self._log = log

    @property
    def debugger(self) -> Any:
        """The :class:`~neuraldbg.NeuralDbg` of the run (None before the first train() unless one was given)."""
        return self._run.debugger

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._run.start(model)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._run.finish() or not self._log:
            return
        try:
            if not getattr(state, "is_world_process_zero", True):
                return
            dbg = self._run.debugger
            metrics = verdict_metrics(dbg)
            state.log_history.append({**metrics, "step": int(state.global_step)})
            console = logging.getLogger("transformers.integrations.neuraldbg")
            console.log(logging.INFO if metrics["neuraldbg/healthy"] else logging.WARNING, verdict_text(dbg))
        except Exception as exc:  # reporting must not replace the outcome of train()
            warnings.warn(f"NeuralDBG could not log its verdict: {exc!r}", NeuralDbgWarning, stacklevel=2)

    def close(self) -> None:
        """Close the debugger if training left it attached (``train()`` raised). Safe to call any time."""
        self._run.finish()

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def __getattr__(name: str) -> Any:
    if name != "NeuralDbgTrainerCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    base = require("transformers", "NeuralDbgTrainerCallback", "pytest-neuraldbg[transformers]").TrainerCallback
    cls = type(name, (TrainerAdapter, base), {"__doc__": TrainerAdapter.__doc__, "__module__": __name__})
    globals()[name] = cls  # built once; pickle finds it here
    return cls
