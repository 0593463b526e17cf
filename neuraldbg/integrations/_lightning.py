"""The Lightning callback's logic, shared by the ``lightning`` and ``pytorch_lightning`` import names.

:func:`callback_class` joins :class:`LightningAdapter` with the ``Callback`` base class of one of those packages;
:mod:`neuraldbg.integrations.lightning` and :mod:`neuraldbg.integrations.pytorch_lightning` each build theirs on
first use, so importing them (or ``neuraldbg``) imports no Lightning.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from typing import Any

from ..errors import NeuralDbgWarning
from .callback import WatchedRun, require, verdict_metrics, verdict_text


class LightningAdapter:
    """Watch ``Trainer.fit`` with NeuralDBG, as ``with NeuralDbg(model): trainer.fit(model)`` would.

    The debugger is attached when fit starts (after ``setup``, before the sanity check) and closed when fit ends,
    also when it raises or is interrupted (``on_exception``). Steps are the engine's: the optimizer steps of
    optimizers that own the model's parameters, which with one optimizer is ``trainer.global_step``. Validation
    and the sanity check run without gradients and are not observed. The verdict goes to every logger of the
    trainer (``neuraldbg/healthy``, ``neuraldbg/failures``, ``neuraldbg/steps`` at the last global step) and, as
    text, to Lightning's console log: the verdict line when healthy, the full report (a warning) when not.

    Args:
        debugger: a :class:`~neuraldbg.NeuralDbg` for the LightningModule, not attached: the ``neuraldbg``
            fixture's ``neuraldbg(model)`` makes the run part of the test's report, gate and baseline. None
            (the default) creates one for the LightningModule that fit trains.
        config, preset, plugins, **options: the engine's arguments for the debugger created here
            (``NeuralDbgCallback(persistence=5)``); not with ``debugger``.
        log: send the verdict to the trainer's loggers and console (default True).

    After fit, ``callback.debugger`` answers every question (``explain_failure()``, ``report()``, ``save()``).
    """

    _package = "lightning.pytorch"  # the Lightning package of the subclass: where the console lines go

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
        """The :class:`~neuraldbg.NeuralDbg` of the run (None before the first fit unless one was given)."""
        return self._run.debugger

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._run.start(pl_module)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._finish(trainer)  # the hooks come out; the trainer then re-raises the exception

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._finish(trainer)  # nothing left to close after on_fit_end; kept for exits that skip it

    def _finish(self, trainer: Any) -> None:
        if not self._run.finish() or not self._log:
            return
        try:
            if not getattr(trainer, "is_global_zero", True):
                return
            dbg = self._run.debugger
            metrics = verdict_metrics(dbg)
            for logger in getattr(trainer, "loggers", ()):
                logger.log_metrics(metrics, step=int(trainer.global_step))
            console = logging.getLogger(f"{self._package}.callbacks.neuraldbg")
            console.log(logging.INFO if metrics["neuraldbg/healthy"] else logging.WARNING, verdict_text(dbg))
        except Exception as exc:  # reporting must not replace the outcome of fit
            warnings.warn(f"NeuralDBG could not log its verdict: {exc!r}", NeuralDbgWarning, stacklevel=2)


def callback_class(package: str, install: str) -> type:
    """``NeuralDbgCallback`` over the ``Callback`` of ``package`` (``"lightning.pytorch"``, ``"pytorch_lightning"``);
    ``install`` is what the error for a missing package tells to install."""
    base = require(package, "NeuralDbgCallback", install).Callback
    return type(
        "NeuralDbgCallback",
        (LightningAdapter, base),
        {"__doc__": LightningAdapter.__doc__, "_package": package},
    )
