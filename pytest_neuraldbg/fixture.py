"""The object the ``neuraldbg`` fixture returns.

Call it to watch a loop you write, or let it train for you::

    def test_my_loop_is_healthy(neuraldbg):
        with neuraldbg(model) as ndbg:          # a neuraldbg.NeuralDbg
            for inputs, targets in loader:
                ...                             # your unmodified training loop
        neuraldbg.assert_healthy(ndbg)

    def test_smoke(neuraldbg):
        ndbg = neuraldbg.smoke_train(model, loader, torch.nn.functional.mse_loss, steps=30)
        assert not ndbg.explain_failure()

Every debugger it creates is recorded and reported (JUnit properties, terminal summary, report files, gate).
The engine options of a run come from, highest first: the call's own arguments, the test's
``@pytest.mark.neuraldbg(...)`` marker, then ``--neuraldbg-preset`` / ``--neuraldbg-persistence`` (or their
environment variables and ini keys). A :class:`~neuraldbg.DebugConfig` passed as ``config`` is used as given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

from . import assertions, options
from .options import OptionError, Settings


class NeuralDbgFixture:
    """Creates watched debuggers for one test and keeps them for its report."""

    assert_healthy = staticmethod(assertions.assert_healthy)
    assert_no_vanishing_gradients = staticmethod(assertions.assert_no_vanishing_gradients)
    assert_no_exploding_gradients = staticmethod(assertions.assert_no_exploding_gradients)
    assert_no_dead_neurons = staticmethod(assertions.assert_no_dead_neurons)
    assert_no_saturation = staticmethod(assertions.assert_no_saturation)
    assert_finite = staticmethod(assertions.assert_finite)
    assert_parameters_update = staticmethod(assertions.assert_parameters_update)

    def __init__(self, settings: Settings, engine_options: Mapping[str, Any] | None = None) -> None:
        self.settings = settings  #: the test's settings (session settings after its marker)
        self.engine_options = dict(engine_options or {})  #: DebugConfig fields from the marker
        self._runs: list[tuple[str, Any]] = []

    @classmethod
    def for_item(cls, item: pytest.Item, session: Settings) -> NeuralDbgFixture:
        """The fixture for ``item``, after its marker. Raises :class:`OptionError` naming a bad marker value."""
        settings, engine = options.apply_marker(session, options.marker_kwargs(item), item.name)
        if engine:
            _check_engine_options(engine, options.marker_source(item.name))
        return cls(settings, engine)

    # --- watching ------------------------------------------------------------------------------------

    def __call__(
        self,
        model: Any,
        config: Any = None,
        *,
        preset: str | None = None,
        plugins: Iterable[Any] = (),
        name: str | None = None,
        **options: Any,
    ) -> Any:
        """A :class:`~neuraldbg.NeuralDbg` for ``model``, recorded for this test's report; use it in ``with``.

        Takes the engine's arguments (``config``, ``preset``, ``plugins``, any DebugConfig field) and
        ``name``, the run's name in reports when a test watches several runs (default: 1, 2, ...).
        """
        from neuraldbg import DebugConfig

        from .watched import WatchedDbg

        if isinstance(config, DebugConfig):
            dbg = WatchedDbg(model, config, preset=preset, plugins=plugins, **options)
        else:
            layered: dict[str, Any] = {}
            if self.settings.persistence is not None:
                layered["persistence"] = self.settings.persistence
            layered.update(self.engine_options)
            if isinstance(config, Mapping):
                layered.update(config)
            elif config is not None:
                raise TypeError(f"neuraldbg(): config must be a DebugConfig or a mapping, got {type(config).__name__}")
            layered.update(options)
            dbg = WatchedDbg(model, preset=preset or self.settings.preset, plugins=plugins, **layered)
        self._runs.append((self._unique(name), dbg))
        return dbg

    def smoke_train(
        self,
        model: Any,
        data: Any,
        loss_fn: Callable[[Any, Any], Any],
        *,
        optimizer: Any = None,
        steps: int | None = None,
        seed: int = 0,
        name: str | None = None,
        config: Any = None,
        preset: str | None = None,
        **options: Any,
    ) -> Any:
        """Train ``model`` briefly under a debugger and return the finished debugger.

        Args:
            model: the ``nn.Module`` to train (its parameters change, as in any training).
            data: an iterable of ``(inputs, targets)`` batches or a DataLoader, cycled when shorter than
                ``steps``; or a callable ``step -> (inputs, targets)``.
            loss_fn: ``loss_fn(model(inputs), targets)`` returns the loss tensor.
            optimizer: an optimizer, a callable ``params -> optimizer``, or None for Adam with lr 1e-3.
            steps: optimizer steps; default ``--neuraldbg-steps`` (50).
            seed: seeds torch, ``random`` and numpy (when installed) for the loop; their states are restored.
            name, config, preset, **options: as for calling the fixture.
        """
        from .smoke import train

        dbg = self(model, config, preset=preset, name=name, **options)
        return train(
            dbg,
            model,
            data,
            loss_fn,
            optimizer=optimizer,
            steps=self.settings.steps if steps is None else steps,
            seed=seed,
        )

    # --- bookkeeping ---------------------------------------------------------------------------------

    @property
    def runs(self) -> list[Any]:
        """The debuggers created in this test, in creation order."""
        return [dbg for _, dbg in self._runs]

    @property
    def named_runs(self) -> list[tuple[str, Any]]:
        """``(name, debugger)`` for each run created in this test."""
        return list(self._runs)

    def close(self) -> None:
        """Detach any debugger still attached (a test that left its ``with`` block open)."""
        for _, dbg in self._runs:
            if dbg.attached:
                dbg.close()

    def _unique(self, name: str | None) -> str:
        taken = {n for n, _ in self._runs}
        base = str(len(self._runs) + 1) if name is None else str(name)
        candidate, suffix = base, 2
        while candidate in taken:
            candidate, suffix = f"{base}-{suffix}", suffix + 1
        return candidate


def _check_engine_options(engine: Mapping[str, Any], source: str) -> None:
    """Validate DebugConfig fields from a marker; the error names the marker, the test and the expectation."""
    import dataclasses
    import difflib

    from neuraldbg import ConfigError, DebugConfig

    known = [f.name for f in dataclasses.fields(DebugConfig)]
    for key in engine:
        if key not in known:
            close = difflib.get_close_matches(key, [*options.PLUGIN_MARKER_KEYS, *known], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise OptionError(
                f"{source}: unknown option {key!r}{hint}; expected {', '.join(options.PLUGIN_MARKER_KEYS)} "
                f"or a neuraldbg.DebugConfig field: {', '.join(known)}"
            )
    try:
        DebugConfig().replace(**engine)
    except ConfigError as exc:
        raise OptionError(f"{source}: {exc}") from None
