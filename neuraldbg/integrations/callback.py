"""What every framework callback shares: the debugger's lifecycle over one training run, and its verdict.

A callback is glue: it tells a :class:`WatchedRun` when training starts (with the model the trainer trains) and
when it ends, by whichever exit the framework reports, and logs :func:`verdict_metrics` and
:func:`verdict_text` where the framework logs. Nothing here imports a framework.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from ..errors import ConfigError, NeuralDbgError


class MissingExtraError(NeuralDbgError, ImportError):
    """A framework callback was used without its library: the message names the extra that installs it."""


def require(module: str, what: str, install: str) -> ModuleType:
    """Import ``module`` for ``what``; when it is not installed, raise :class:`MissingExtraError` saying what to
    install (``install``: the pip requirement, ``"pytest-neuraldbg[lightning]"``)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.split(".")[0]
        if exc.name is None or exc.name.split(".")[0] != top:
            raise  # the library is there but one of its own imports failed: show that error as it is
        raise MissingExtraError(
            f'{what} needs the {top!r} package, which is not installed; install it with: pip install "{install}"'
        ) from exc


class WatchedRun:
    """One debugger over a framework's training runs: created at the first start (or given), attached when
    training starts, closed when it ends. Starting again after an end continues the same run, as
    :meth:`NeuralDbg.attach` does.

    Args:
        owner: the callback's name, for error messages (``"NeuralDbgCallback()"``).
        debugger: a :class:`~neuraldbg.NeuralDbg` that is not attached (for example the ``neuraldbg`` fixture's
            ``neuraldbg(model)``), or None to create one for the model the trainer trains.
        config, preset, plugins, options: the engine's arguments for the debugger created here.
    """

    def __init__(
        self,
        owner: str,
        debugger: Any,
        config: Any,
        preset: str | None,
        plugins: Iterable[Any],
        options: Mapping[str, Any],
    ) -> None:
        from .. import NeuralDbg
        from ..config import make_config

        self._owner = owner
        plugins = tuple(plugins)
        if debugger is not None:
            if not isinstance(debugger, NeuralDbg):
                raise ConfigError(
                    f"{owner}: debugger must be a neuraldbg.NeuralDbg (for example the neuraldbg fixture's "
                    f"neuraldbg(model)), got {type(debugger).__name__}"
                )
            given = [name for name, value in (("config", config), ("preset", preset)) if value is not None]
            given += ["plugins"] if plugins else []
            if given or options:
                raise ConfigError(
                    f"{owner}: got a debugger and engine options ({', '.join([*given, *options])}); "
                    "give the options where the debugger is created"
                )
        # a bad option fails here, not mid-training
        self._config = make_config(config, preset, owner, ("debugger", "config", "preset", "plugins", "log"), **options)
        self._plugins = plugins
        self.debugger: NeuralDbg | None = debugger
        self._attached_here = False

    def start(self, model: Any) -> None:
        """Training of ``model`` starts: attach the debugger (created now for ``model`` if none was given)."""
        from .. import NeuralDbg

        if self.debugger is None:
            self.debugger = NeuralDbg(model, self._config, plugins=self._plugins)
        dbg = self.debugger
        watched = dbg.model  # held weakly by the engine, unwrapped from torch.compile
        if watched is not None and watched is not model and getattr(model, "_orig_mod", None) is not watched:
            raise NeuralDbgError(
                f"{self._owner}: the debugger watches a {type(watched).__name__}, but the trainer trains a "
                f"{type(model).__name__}; create the debugger for the model you pass to the trainer"
            )
        if dbg.attached:
            if not self._attached_here:
                raise NeuralDbgError(
                    f"{self._owner}: the debugger is already attached (inside a `with` block?); give the callback "
                    "a debugger that is not attached, it attaches it when training starts and closes it when "
                    "training ends; or keep the `with` block and leave the callback out"
                )
            dbg.close()  # left attached by a run that ended without telling the callback (an exception)
        dbg.attach()
        self._attached_here = True

    def finish(self) -> bool:
        """Training ended: close the debugger if this run attached it. True when it did (report the verdict then);
        False when there was nothing to close (an end already handled, or training that never started)."""
        if not self._attached_here or self.debugger is None:
            return False
        self._attached_here = False
        self.debugger.close()
        return True


def verdict_metrics(dbg: Any) -> dict[str, float]:
    """Numbers a framework logger takes: healthy (1.0 or 0.0), the number of failure hypotheses, steps observed."""
    hypotheses = dbg.hypotheses()
    return {
        "neuraldbg/healthy": 0.0 if hypotheses else 1.0,
        "neuraldbg/failures": float(len(hypotheses)),
        "neuraldbg/steps": float(dbg.steps),
    }


def verdict_text(dbg: Any) -> str:
    """The verdict line alone when healthy, the full report (each hypothesis explained) when not."""
    report: str = dbg.report()
    return report if dbg.hypotheses() else report.splitlines()[0]
