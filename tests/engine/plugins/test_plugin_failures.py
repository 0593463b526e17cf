"""A third-party plugin that goes wrong is named, with where it came from and what was expected, and never takes the
training or the built-in diagnosis down with it: a kind whose words fail is told in generic words, a plugin's
state is a selector like a built-in one, an installed plugin that cannot be loaded is skipped with a warning, and a
plugin given in code whose hook fails or returns the wrong thing is refused when the debugger is made."""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import support
import torch
from torch import nn

import neuraldbg
from neuraldbg import ConfigError, FailureKind, NeuralDbgError, NeuralDbgWarning, hookimpl
from neuraldbg.detectors import Detector, Finding, Observation, StepView
from neuraldbg.events import EventType, SemanticEvent
from neuraldbg.health import HealthState
from neuraldbg.kinds import Kind, registry
from neuraldbg.kinds.base import Unregistered
from neuraldbg.plugins import manager

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(autouse=True)
def restore_registry() -> Iterator[None]:
    """The kinds a plugin registers stay registered for the process: put the registry back after each test. (A
    kind's failure is warned about once per process: each test names its kinds apart.)"""
    rooms = registry._rooms.copy()
    try:
        yield
    finally:
        registry._rooms.clear()
        registry._rooms.update(rooms)


def plugin(name: str, **hooks: Callable[..., Any]) -> types.ModuleType:
    module = types.ModuleType(name)
    for hook, function in hooks.items():
        setattr(module, hook, hookimpl(function))
    return module


def dead_model() -> nn.Sequential:
    """A ReLU layer that is dead from the start: the built-in dead_neurons kind finds it."""
    torch.manual_seed(0)
    model = support.mlp(width=16, depth=2)
    with torch.no_grad():
        model[2].bias.fill_(-30.0)
    return model


def train(model: nn.Module, steps: int = 12, **options: Any) -> neuraldbg.NeuralDbg:
    batches = support.regression_batches()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with neuraldbg.NeuralDbg(model, **options) as dbg:
        for step in range(steps):
            x, y = batches(step)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    return dbg


# --- a kind whose words fail ----------------------------------------------------------------------------------


class Bad(HealthState):
    BAD = "bad_state"


def broken_kind(name: str, **methods: Callable[..., Any]) -> Kind:
    """A kind that finds every layer's output 'bad' from the first step, with ``methods`` overridden."""

    class AlwaysBad(Detector):
        event_type = EventType.ACTIVATION

        def observe(self, view: StepView) -> Observation:
            obs = Observation()
            for (layer, call), _ in view.data.act.items():
                if layer:
                    obs.saw(self.event_type, layer, call=call)
                    obs.findings.append(Finding(self.event_type, room.kind, layer, Bad.BAD, {"v": 1.0}, 1.0, call=call))
            return obs

    AlwaysBad.name = name
    cls = type(name.title().replace("_", ""), (Kind,), {"name": name, "states": (Bad.BAD,), **methods})
    cls.detectors = lambda self, config: [AlwaysBad()]  # type: ignore[attr-defined]
    room: Kind = cls()
    return room


def boom(*args: object) -> Any:
    raise RuntimeError("boom")


def every_query(dbg: neuraldbg.NeuralDbg, tmp_path: Path) -> None:
    assert dbg.hypotheses()
    assert dbg.explain_failure()
    assert dbg.report()
    assert dbg.get_root_causes()
    assert dbg.export_mermaid_causal_graph().startswith("flowchart")
    assert [str(e) for e in dbg.events]
    dbg.save(tmp_path / "run.json")


def test_a_kind_whose_explain_raises_gets_generic_words_once_warned_and_the_built_in_diagnosis_stands(
    tmp_path: Path,
) -> None:
    room = broken_kind("explain_raises", explain=boom)
    model = dead_model()
    before = [p.detach().clone() for p in model.parameters()]
    dbg = train(model, plugins=[plugin("explain_raises_plugin", neuraldbg_kinds=lambda: [room])])
    assert dbg.steps == 12 and any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        every_query(dbg, tmp_path)
        every_query(neuraldbg.load(tmp_path / "run.json"), tmp_path)
    said = [str(w.message) for w in caught if issubclass(w.category, NeuralDbgWarning)]
    assert len(said) == 1, said
    assert "explain() of the failure kind 'explain_raises'" in said[0] and "RuntimeError('boom')" in said[0]
    kinds = {h.kind.value: h for h in dbg.hypotheses()}
    assert {"dead_neurons", "explain_raises"} <= set(kinds)
    assert kinds["explain_raises"].explanation.startswith("Explain raises in ")  # the generic words
    assert kinds["dead_neurons"].explanation.startswith("Dead neurons in ")


@pytest.mark.parametrize("method", ["describe", "label", "place", "lane", "choose_root"])
@pytest.mark.parametrize("answer", [boom, lambda *args: 42], ids=["raises", "returns_a_number"])
def test_a_kind_method_that_fails_falls_back_to_the_default_and_every_query_answers(
    method: str, answer: Callable[..., Any], tmp_path: Path
) -> None:
    name = f"{method}_{'raises' if answer is boom else 'returns_a_number'}"
    room = broken_kind(name, **{method: answer})
    dbg = train(dead_model(), plugins=[plugin(f"{name}_plugin", neuraldbg_kinds=lambda: [room])])
    with pytest.warns(NeuralDbgWarning) as caught:  # the default label() asks describe(): both are named
        every_query(dbg, tmp_path)
    assert any(f"{method}() of the failure kind '{name}'" in str(w.message) for w in caught)
    assert {"dead_neurons", name} <= {h.kind.value for h in dbg.hypotheses()}


# --- a plugin's state as a selector ---------------------------------------------------------------------------


def test_trace_causal_chain_takes_a_plugins_health_state_by_its_name_like_a_built_in_one() -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        zero_output_kind = importlib.import_module("zero_output_kind")
    finally:
        sys.path.remove(str(EXAMPLES))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(p=1.0), nn.Linear(32, 1))
    dbg = train(model, steps=20, plugins=[zero_output_kind])
    chain = dbg.trace_causal_chain(zero_output_kind.Output.ZERO)
    assert chain and chain[0].kind is FailureKind("zero_output")
    assert dbg.trace_causal_chain("zero") == chain
    assert dbg.trace_causal_chain("ZERO") == chain


def test_a_selector_of_another_type_is_refused_naming_every_type_accepted() -> None:
    dbg = train(dead_model(), steps=2)
    with pytest.raises(ConfigError, match=r"a FailureKind, an EventType, a health state .*got int"):
        dbg.trace_causal_chain(3)  # type: ignore[arg-type]


# --- an installed plugin that cannot be loaded ----------------------------------------------------------------


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str], None]]:
    """Installs distributions with a ``neuraldbg`` entry point for the test (a dist-info folder on sys.path)."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))

    def install(dist: str, entry_points: str, module: str = "", source: str = "") -> None:
        info = folder / f"{dist}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n", "utf-8")
        (info / "entry_points.txt").write_text(f"[neuraldbg]\n{entry_points}\n", "utf-8")
        if module:
            (folder / f"{module}.py").write_text(source, "utf-8")
        manager._entry_point_plugins.cache_clear()

    yield install  # type: ignore[misc]
    manager._entry_point_plugins.cache_clear()
    for name in ("badplug_raises",):
        sys.modules.pop(name, None)


def test_an_installed_plugin_that_cannot_be_imported_is_skipped_with_a_warning_naming_it(
    site: Callable[..., None], tmp_path: Path
) -> None:
    site("badplug", "broken = badplug_mod_missing")
    with pytest.warns(NeuralDbgWarning) as caught:
        dbg = train(dead_model())
    (said,) = [str(w.message) for w in caught if "skipped" in str(w.message)]
    assert "entry point 'broken = badplug_mod_missing' of the distribution badplug 0.1" in said
    assert "ModuleNotFoundError" in said and "pip uninstall badplug" in said
    assert dbg.hypotheses()[0].kind is FailureKind.DEAD_NEURONS
    path = dbg.save(tmp_path / "run.json")
    assert neuraldbg.load(path).hypotheses()[0].kind is FailureKind.DEAD_NEURONS
    from neuraldbg.cli import main

    assert main(["explain", path]) == 1  # failures found, not an internal error (3)


def test_an_installed_plugin_whose_hook_raises_is_skipped_with_a_warning_naming_it(site: Callable[..., None]) -> None:
    source = "from neuraldbg import hookimpl\n\n@hookimpl\ndef neuraldbg_detectors(config):\n    return 1 / 0\n"
    site("badplug", "raises = badplug_raises", "badplug_raises", source)
    with pytest.warns(NeuralDbgWarning, match=r"'raises = badplug_raises' of the distribution badplug 0.1.*"):
        dbg = train(dead_model())
    assert dbg.hypotheses()[0].kind is FailureKind.DEAD_NEURONS


# --- a plugin given in code that is malformed -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("hook", "function", "expected"),
    [
        ("neuraldbg_detectors", lambda config: ["x"], "neuraldbg.detectors.Detector"),
        ("neuraldbg_causal_rules", lambda: ["x"], "neuraldbg.reasoning.CausalRule"),
        ("neuraldbg_kinds", lambda: ["x"], "neuraldbg.kinds.Kind"),
        ("neuraldbg_causal_rules", lambda: "x", "neuraldbg.reasoning.CausalRule"),
    ],
)
def test_a_hook_that_returns_the_wrong_thing_is_a_config_error_naming_the_plugin_hook_and_what_was_expected(
    hook: str, function: Callable[..., Any], expected: str
) -> None:
    with pytest.raises(
        ConfigError, match=rf"plugin module 'mine': its {hook}\(\) returned .*'x'.*; expected a list of {expected}"
    ):
        neuraldbg.NeuralDbg(nn.Linear(2, 2), plugins=[plugin("mine", **{hook: function})])


@pytest.mark.parametrize("hook", ["neuraldbg_detectors", "neuraldbg_causal_rules", "neuraldbg_kinds"])
def test_a_hook_that_raises_is_a_config_error_naming_the_plugin_and_the_hook(hook: str) -> None:
    function = (lambda config: 1 / 0) if hook == "neuraldbg_detectors" else (lambda: 1 / 0)
    with pytest.raises(ConfigError, match=rf"plugin module 'mine': its {hook}\(\) raised ZeroDivisionError") as info:
        neuraldbg.NeuralDbg(nn.Linear(2, 2), plugins=[plugin("mine", **{hook: function})])
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize("plugins", ["zero_output_kind", ["zero_output_kind"]], ids=["a_string", "a_list_of_one"])
def test_a_plugin_named_by_a_string_is_refused_saying_to_pass_the_module(plugins: object) -> None:
    with pytest.raises(NeuralDbgError, match=r"got the string 'zero_output_kind'; import the module and pass it"):
        neuraldbg.NeuralDbg(nn.Linear(2, 2), plugins=plugins)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"register_plugin\(\): expected a plugin .*got the string"):
        neuraldbg.register_plugin("zero_output_kind")


@pytest.mark.parametrize("method", ["describe", "label", "effect", "place"])
def test_an_event_of_a_kind_whose_words_raise_is_told_in_the_generic_words(method: str) -> None:
    room = registry.register(broken_kind(f"{method}_raises_alone", **{method: boom}))
    event = SemanticEvent(EventType.ACTIVATION, room.kind, "0", None, 0, 3, None, Bad.BAD, {"v": 1.0}, 1.0)
    generic = Kind.__dict__[method]
    with pytest.warns(NeuralDbgWarning, match=rf"{method}\(\) of the failure kind '{method}_raises_alone'"):
        assert getattr(registry, method)(event) == generic(Unregistered(room.name), event)
        assert str(event) == f"'0': {method} raises alone (bad state), steps 0-3"
