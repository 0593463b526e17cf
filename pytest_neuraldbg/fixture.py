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
With ``@pytest.mark.neuraldbg(baseline=True)``, or ``neuraldbg.assert_matches_baseline(ndbg)``, the runs are
compared with the test's training-health baseline (see :mod:`pytest_neuraldbg.baseline`).
The engine options of a run come from, highest first: the call's own arguments, the test's
``@pytest.mark.neuraldbg(...)`` marker, then ``--neuraldbg-preset`` / ``--neuraldbg-persistence`` (or their
environment variables and ini keys). A :class:`~neuraldbg.DebugConfig` passed as ``config`` is used as given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

import pytest

from neuraldbg.config import RUN_KEYWORDS

from . import assertions, baseline, options
from .errors import ArgumentError, ArgumentTypeError, hide_usage_problems
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
    assert_learns = staticmethod(assertions.assert_learns)

    def __init__(
        self,
        settings: Settings,
        engine_options: Mapping[str, Any] | None = None,
        baseline_check: baseline.BaselineCheck | None = None,
    ) -> None:
        self.settings = settings  #: the test's settings (session settings after its marker)
        self.engine_options = dict(engine_options or {})  #: DebugConfig fields from the marker
        self.baseline = baseline_check  #: the test's training-health baseline (None outside a pytest item)
        self._runs: list[tuple[str, Any]] = []
        self._devices: dict[str, str | None] = {}  # run name -> device type of its model when watched
        self._origins: dict[str, dict[str, Any]] = {}  # run name -> smoke_train's seed and steps
        self.config: Any = None  # the pytest config of the test (for progress lines), None outside a test
        self.nodeid = ""

    @classmethod
    def for_item(cls, item: pytest.Item, session: Settings) -> NeuralDbgFixture:
        """The fixture for ``item``, after its marker. Raises :class:`OptionError` naming a bad marker value."""
        settings, engine = options.apply_marker(session, options.marker_kwargs(item), item.name)
        if engine:
            _check_engine_options(engine, options.marker_source(item.name))
        module, test_id = baseline.locate(item)
        path = baseline.path_for(module, test_id)
        check = baseline.BaselineCheck(
            path=path,
            shown_path=baseline.shown(path, item.config.rootpath),
            nodeid=item.nodeid,
            test_id=test_id,
            settings=settings,
            location=(str(item.path), item.location[1] + 1 if item.location[1] is not None else 1),
        )
        fixture = cls(settings, engine, check)
        fixture.config, fixture.nodeid = item.config, item.nodeid
        return fixture

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
        __tracebackhide__ = True
        return self._watch(model, config, preset, plugins, name, options, "neuraldbg()", _CALL_KEYWORDS)

    def _watch(
        self,
        model: Any,
        config: Any,
        preset: str | None,
        plugins: Iterable[Any],
        name: str | None,
        options: dict[str, Any],
        where: str,
        keywords: tuple[str, ...],
    ) -> Any:
        """Create, record and return the watched debugger; ``where`` and ``keywords`` name the entry point."""
        __tracebackhide__ = True
        from neuraldbg import ConfigError, DebugConfig

        from .watched import WatchedDbg

        if config is not None and not isinstance(config, (DebugConfig, Mapping)):
            raise ArgumentTypeError(
                f"{where}: config must be a neuraldbg.DebugConfig or a mapping, got {type(config).__name__}"
            )
        problem: ConfigError | None = None
        try:
            _check_call_options(config, preset, options, where, keywords)
            if isinstance(config, DebugConfig):
                dbg = WatchedDbg(model, config, preset=preset, plugins=plugins, **options)
            else:
                layered: dict[str, Any] = {}
                if self.settings.persistence is not None:
                    layered["persistence"] = self.settings.persistence
                layered.update(self.engine_options)
                layered.update(config or {})
                layered.update(options)
                dbg = WatchedDbg(model, preset=preset or self.settings.preset, plugins=plugins, **layered)
        except ConfigError as exc:  # a misspelt or out-of-range option: the engine's message, at the test's line
            problem = exc
        if problem is not None:
            raise problem.with_traceback(None)
        run = self._unique(name)
        self._runs.append((run, dbg))
        self._devices[run] = baseline.device_of(model)
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
        overfit: bool = False,
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
            seed: seeds torch, ``random``, numpy (when installed) and a ``DataLoader``'s own ``generator``
                (if it was given one; otherwise its shuffling and worker seeds come from torch's) for the
                loop; their states are restored afterwards.
            overfit: train every step on the first batch of ``data`` (the "overfit one batch" check: a
                healthy model and loop drive its loss down fast; see :func:`~pytest_neuraldbg.assert_learns`).
            name, config, preset, **options: as for calling the fixture.

        The loss of every step is recorded (``observe_loss``), for :func:`~pytest_neuraldbg.assert_learns`
        and baselines. Arguments it cannot train with (``steps=0``, a model without trainable parameters, a
        loss that is not a one-element tensor) fail at the test's line with a message naming the argument.

        Deterministic runs (for baselines): the loop is seeded, but what happens before it is yours to seed:
        call ``torch.manual_seed(...)`` before building the model (its initialisation) and build generated
        data with a seeded ``torch.Generator``; random augmentations inside a Dataset and DataLoader workers
        follow torch's seed. On a GPU add ``torch.use_deterministic_algorithms(True)``.
        """
        __tracebackhide__ = hide_usage_problems
        from .smoke import check_arguments, train

        total = self.settings.steps if steps is None else steps
        check_arguments(model, loss_fn, total, overfit)
        plugins = options.pop("plugins", ())
        where, keywords = "neuraldbg.smoke_train()", _SMOKE_KEYWORDS
        dbg = self._watch(model, config, preset, plugins, name, options, where, keywords)
        origin: dict[str, Any] = {"seed": seed, "steps": total}
        if overfit:
            origin["overfit"] = True
        self._origins[self._runs[-1][0]] = origin
        progress = None
        if self.config is not None:
            from .ci import Progress

            label = self.nodeid if len(self._runs) == 1 else f"{self.nodeid} [run {self._runs[-1][0]}]"
            progress = Progress(self.config, label, total)
        train(
            dbg, model, data, loss_fn, optimizer=optimizer, steps=total, seed=seed, overfit=overfit, progress=progress
        )
        if progress is not None and progress.lines:
            progress.finish([h.summary() for h in dbg.hypotheses()])
        return dbg

    # --- baselines -----------------------------------------------------------------------------------

    def assert_matches_baseline(self, ndbg: Any, *, name: str | None = None) -> None:
        """Compare a finished run with this test's training-health baseline; fail the test on a regression.

        The baseline is ``__neuraldbg__/<module>/<test>.json`` next to the test module, written by
        ``pytest --neuraldbg-update-baselines`` (review and commit it). A missing or unreadable file fails
        with the command that writes it. Gradient norms and update ratios may move by ``grad_tolerance``
        (a factor, default 10), dead and saturated fractions may rise by ``fraction_tolerance`` (default
        0.1) and the loss by ``loss_tolerance`` (relative, default 0.25); new failure verdicts always fail.
        Improvements pass and are listed in the terminal summary; another torch version or device warns
        (:class:`~pytest_neuraldbg.NeuralDbgBaselineWarning`). See :mod:`pytest_neuraldbg.baseline`.

        ``ndbg`` is a run this fixture created (stored under its run name) or any finished debugger or
        trace, stored under ``name``. A fixture method only: the file belongs to the running test.
        Deterministic runs are needed; see :meth:`smoke_train` for what to seed.
        """
        __tracebackhide__ = True
        if self.baseline is None:
            raise RuntimeError("assert_matches_baseline(): this fixture does not belong to a pytest test")
        run = self._run_name(ndbg, name)
        if getattr(ndbg, "attached", False):
            raise RuntimeError(
                f"assert_matches_baseline(): run {run!r} is still being watched; compare it after its with block"
            )
        self.baseline.check({run: self._observe(run, ndbg)}, complete=False, fail=_assertion_failure)

    def finish_baseline(self, passed: bool) -> None:
        """After the test body (called by the plugin): with ``baseline=True`` compare every run not compared
        yet, and all runs stored in the file must have been watched; when updating, write the file.

        A ``baseline=True`` test that watched no run fails (it has nothing to compare, and nothing is written).
        """
        __tracebackhide__ = True
        if self.baseline is None:
            return
        if passed and self.settings.baseline and not self._runs and not self.baseline.compared:
            self.baseline.no_run(_test_failure, marker=True)
        if passed and self.settings.baseline:
            rest = [(run, dbg) for run, dbg in self._runs if run not in self.baseline.compared]
            for _, dbg in rest:
                if dbg.attached:
                    dbg.close()
            observed = {run: self._observe(run, dbg) for run, dbg in rest}
            self.baseline.check(observed, complete=True, fail=_test_failure)
        self.baseline.finish(passed, due=self.settings.baseline and bool(self._runs))

    def _run_name(self, ndbg: Any, name: str | None) -> str:
        __tracebackhide__ = True
        if name is not None:
            return str(name)
        for run, dbg in self._runs:
            if dbg is ndbg:
                return run
        raise ArgumentError(
            "assert_matches_baseline(): this debugger was not created by the neuraldbg fixture; "
            "pass name=... to store it under a run name"
        )

    def _observe(self, run: str, dbg: Any) -> baseline.Observed:
        own = next((name for name, d in self._runs if d is dbg), None)  # a run of this fixture, by any name
        device = self._devices.get(own) if own is not None else None
        origin = self._origins.get(own) if own is not None else None
        return baseline.summarise(dbg, baseline.environment(dbg, device=device, origin=origin))

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


def _assertion_failure(text: str) -> NoReturn:
    __tracebackhide__ = True
    raise AssertionError(text)


def _test_failure(text: str) -> NoReturn:
    __tracebackhide__ = True
    pytest.fail(text, pytrace=False)


#: The keywords of ``neuraldbg(...)`` and ``neuraldbg.smoke_train(...)`` besides the DebugConfig fields, and the
#: ones both hand to ``NeuralDbg()`` as they are: a misspelt one is suggested as itself.
_PASSED_TO_ENGINE = RUN_KEYWORDS
_CALL_KEYWORDS = ("model", "config", "preset", "plugins", "name", *_PASSED_TO_ENGINE)
_SMOKE_KEYWORDS = (
    "model",
    "data",
    "loss_fn",
    "optimizer",
    "steps",
    "seed",
    "overfit",
    "name",
    "config",
    "preset",
    "plugins",
    *_PASSED_TO_ENGINE,
)


def _check_call_options(
    config: Any, preset: str | None, given: Mapping[str, Any], where: str, keywords: tuple[str, ...]
) -> None:
    """A misspelt option or preset of a fixture call: a ConfigError naming the call and the closest valid name
    (rather than the engine's ``NeuralDbg()``, which the user did not write)."""
    from neuraldbg.config import check_options, check_preset

    if preset is not None:
        check_preset(preset, where)
    if isinstance(config, Mapping):
        check_options(config, f"{where}: config")
    check_options({k: v for k, v in given.items() if k not in _PASSED_TO_ENGINE}, where, keywords)


def _check_engine_options(engine: Mapping[str, Any], source: str) -> None:
    """Validate DebugConfig fields from a marker; the error names the marker, the test and the expectation."""
    import dataclasses

    from neuraldbg import ConfigError, DebugConfig
    from neuraldbg.errors import did_you_mean

    known = [f.name for f in dataclasses.fields(DebugConfig)]
    for key in engine:
        if key not in known:
            hint = did_you_mean(key, [*options.PLUGIN_MARKER_KEYS, *known])
            raise OptionError(
                f"{source}: unknown option {key!r}{hint}; expected {', '.join(options.PLUGIN_MARKER_KEYS)} "
                f"or a neuraldbg.DebugConfig field: {', '.join(known)}"
            )
    try:
        DebugConfig().replace(**engine)
    except ConfigError as exc:
        raise OptionError(f"{source}: {exc}") from None
