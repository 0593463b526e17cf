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
"""

from __future__ import annotations

import platform
import weakref
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import torch
from torch import nn

from . import __version__, plugins
from .analysis import Analyzer
from .config import DebugConfig, make_config
from .diagnosis import Diagnosis
from .errors import ConfigError, NeuralDbgError
from .events import SemanticEvent
from .layers import LayerInfo, describe
from .reasoning import CausalRule, Topology
from .recorder import Recorder


class NeuralDbg(Diagnosis):
    """Watch a model's training and explain what went wrong.

    Args:
        model: the ``nn.Module`` being trained. When you compile, pass the ``torch.compile`` d module: it is
            unwrapped for layer names, and the debugger keeps its step bookkeeping out of the compiled graph.
        config: a :class:`~neuraldbg.DebugConfig` or a mapping of its fields.
        preset: ``"default"``, ``"full"`` (full statistics every step) or ``"economy"``.
        plugins: extra plugins (see :mod:`neuraldbg.hookspecs`) for this debugger only.
        **options: any :class:`~neuraldbg.DebugConfig` field, e.g. ``persistence=5``.
    """

    def __init__(
        self,
        model: nn.Module,
        config: DebugConfig | Mapping[str, Any] | None = None,
        *,
        preset: str | None = None,
        plugins: Iterable[Any] = (),
        **options: Any,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ConfigError(f"NeuralDbg(): expected a torch.nn.Module, got {type(model).__name__}")
        self.config = make_config(config, preset, "NeuralDbg()", **options)
        root = getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule wraps the real module
        if not isinstance(root, nn.Module):
            root = model
        self._model = weakref.ref(root)
        self._model_class = type(root).__name__
        self._compiled = root is not model
        self._infos: dict[str, LayerInfo] = describe(root, self.config.saturation_derivative)
        pm = _plugin_manager(plugins)
        self._rules: list[CausalRule] = _rules(pm)
        order: list[tuple[str, int]] = []  # one list: the recorder appends, the detectors read
        self._analyzer = Analyzer(self.config, self._infos, order, _detectors(pm, self.config))
        self._recorder = Recorder(root, self._infos, self.config, self._analyzer.consume, order)
        self._analyzer.watch_coverage(self._recorder.coverage, self._recorder.run_facts)
        self.history = self._analyzer.history

    # --- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> NeuralDbg:
        if not self.attached:  # ``with watch(model) as dbg:`` is already attached
            self.attach()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()  # the user's exception, if any, propagates unchanged

    def attach(self) -> NeuralDbg:
        """Install the hooks (done by ``with``); attaching again after ``close()`` continues the same run."""
        if self.attached:
            raise NeuralDbgError("NeuralDbg is already attached to this model; use one `with` block at a time")
        if self._model() is None:
            raise NeuralDbgError("NeuralDbg: the model was garbage-collected; keep a reference while training")
        self._recorder.attach()
        return self

    @property
    def model(self) -> nn.Module | None:
        """The watched model (the module inside a ``torch.compile`` wrapper), or None once it was collected."""
        return self._model()

    @property
    def attached(self) -> bool:
        return self._recorder.attached

    def close(self) -> None:
        """Finish the step in progress and remove every hook. Safe to call twice."""
        self._recorder.detach()

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
        )
        return self._analyzer.events(final=not self.attached), topo, self._rules

    def _meta(self) -> dict[str, Any]:
        return {
            "model": self._model_class,
            "compiled": self._compiled,
            "steps_observed": self._analyzer.steps_observed,
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


def _plugin_manager(extra: Iterable[Any]) -> Any:
    try:
        return plugins.manager(extra)
    except Exception as exc:  # a broken third-party plugin must not stop training
        raise NeuralDbgError(f"NeuralDbg: loading plugins failed: {exc!r}") from exc


def _detectors(pm: Any, config: DebugConfig) -> list[Any]:
    return plugins.detectors(pm, config)


def _rules(pm: Any) -> list[CausalRule]:
    return plugins.rules(pm)
