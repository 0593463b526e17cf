"""A failure kind added by a plugin is a kind like the built-in ones: it becomes a root cause with its words, it
fails the run, and it survives a trace; entry points, ``register_plugin`` and ``plugins=`` all reach it.

The plugin is the documentation's example (``examples/zero_output_kind.py``): a layer whose output is exactly zero,
here an ``nn.Dropout(p=1.0)`` left in a model by mistake.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import support
import torch
from torch import nn

import neuraldbg
from neuraldbg import FailureKind
from neuraldbg.kinds import registry
from neuraldbg.plugins import manager
from pytest_neuraldbg import assert_healthy

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(scope="module")
def plugin() -> Iterator[object]:
    """The example plugin. The kinds a debugger's plugins register stay registered for the process (by design: a
    report names every kind the process knows), so the registry is restored after this module: tests that run
    later in the same process count the built-in kinds only."""
    kinds = registry._rooms.copy()
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield importlib.import_module("zero_output_kind")
    finally:
        sys.path.remove(str(EXAMPLES))
        registry._rooms.clear()
        registry._rooms.update(kinds)


def dropout_one(p: float = 1.0) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(p), nn.Linear(16, 1))


def train(model: nn.Module, **options: object) -> neuraldbg.NeuralDbg:
    batches = support.regression_batches(in_features=8)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with neuraldbg.NeuralDbg(model, **options) as dbg:
        for step in range(20):
            x, y = batches(step)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    return dbg


def test_the_fault_is_real_in_plain_torch() -> None:
    model = dropout_one()
    x, y = support.regression_batches(in_features=8)(0)
    out = model[2](model[1](model[0](x)))
    nn.functional.mse_loss(model[3](out), y).backward()
    assert out.abs().max() == 0.0  # the dropout's output is zero on every sample
    assert model[0].weight.grad.abs().max() == 0.0  # and no gradient flows back through it
    assert model[3].weight.grad.abs().max() == 0.0  # the last layer learns nothing from the input


def test_a_plugin_kind_is_the_root_cause_with_its_own_words_and_what_it_causes(plugin: object) -> None:
    dbg = train(dropout_one(), plugins=[plugin])
    top = dbg.hypotheses()[0]
    assert (top.kind, top.root.layer, top.root.step_start) == (FailureKind("zero_output"), "2", 0)
    assert top.explanation.startswith("'2' (Dropout) outputs exactly zero on every sample from step 0")
    assert "Fix: find what zeroes the output of '2'" in top.explanation
    assert any(c.relation == "zeroes the gradient of" and c.effect.layer == "0" for c in top.couplings)
    assert "'2': output exactly zero on every sample, steps 0-" in str(top.root)
    assert "zero_output" in dbg.report() and "zero_output" in dbg.export_mermaid_causal_graph()
    with pytest.raises(AssertionError, match="zero_output at '2' from step 0"):
        assert_healthy(dbg)
    assert "zero_output" in dbg.checked_kinds()


def test_a_plugin_kind_stays_silent_on_the_healthy_twin(plugin: object) -> None:
    dbg = train(dropout_one(p=0.1), plugins=[plugin])
    assert dbg.healthy, dbg.report()


def test_a_plugin_kind_survives_a_trace_and_is_named_when_its_plugin_is_absent(plugin: object, tmp_path: Path) -> None:
    dbg = train(dropout_one(), plugins=[plugin])
    path = dbg.save(tmp_path / "run.json")
    loaded = neuraldbg.load(path)
    assert loaded.explain_failure() == dbg.explain_failure()  # the plugin is loaded in this process: its words
    # in a process without the plugin the kind is unknown: it loads, and is reported by its name
    room = registry._rooms.pop(FailureKind("zero_output"))
    try:
        absent = neuraldbg.load(path)
        assert "zero_output" in [h.kind.value for h in absent.hypotheses()]  # without its rules: apart, after
        assert "Zero output in '2' (Dropout)" in absent.report()
    finally:
        registry._rooms[room.kind] = room


def test_a_traces_states_come_back_as_the_live_run_held_them_built_in_plugin_and_run_level(
    plugin: object, tmp_path: Path
) -> None:
    """A state read back from a trace is the same object as in the live run: a built-in health state even when a
    kind has its name (``non_finite``), a plugin's own state when its plugin is installed, a run-level finding's
    kind. Before, a ``non_finite`` event's state came back as the kind and a plugin's as a plain string."""
    from neuraldbg.demo import bad_batch

    runs = [bad_batch(), train(dropout_one(), plugins=[plugin])]
    for i, dbg in enumerate(runs):
        loaded = neuraldbg.load(dbg.save(tmp_path / f"run{i}.json"))
        assert len(loaded.events) == len(dbg.events)
        for live, back in zip(dbg.events, loaded.events):
            assert back.to_state == live.to_state and type(back.to_state) is type(live.to_state)
            assert back.from_state == live.from_state and type(back.from_state) is type(live.from_state)
    kinds = {type(e.to_state).__name__ for dbg in runs for e in dbg.events}
    assert {"ActivationHealth", "Output"} <= kinds  # the demo's non_finite states and the plugin's own


def test_without_the_plugin_the_same_run_is_rooted_at_the_vanishing_gradients(plugin: object) -> None:
    dbg = train(dropout_one())
    assert [h.kind for h in dbg.hypotheses()] == [FailureKind.VANISHING_GRADIENTS]


def test_a_registered_plugin_adds_its_kind_to_every_new_debugger_until_unregistered(plugin: object) -> None:
    neuraldbg.register_plugin(plugin)
    try:
        assert train(dropout_one()).hypotheses()[0].kind.value == "zero_output"
    finally:
        neuraldbg.unregister_plugin(plugin)
    assert "zero_output" not in train(dropout_one()).checked_kinds()


def test_an_entry_point_of_an_installed_distribution_adds_the_kind(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(EXAMPLES / "zero_output_kind.py", site / "zero_output_plugin.py")
    info = site / "zero_output_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zero-output-plugin\nVersion: 1.0\n", "utf-8")
    (info / "entry_points.txt").write_text("[neuraldbg]\nzero_output = zero_output_plugin\n", "utf-8")
    monkeypatch.syspath_prepend(str(site))
    manager._entry_point_plugins.cache_clear()
    kinds = registry._rooms.copy()
    registry._rooms.pop(FailureKind("zero_output"), None)  # the copy below is another module's class
    try:
        assert "zero_output" in [k.name for k in manager.kinds_of(manager.manager())]
        assert train(dropout_one()).hypotheses()[0].kind.value == "zero_output"
    finally:
        manager._entry_point_plugins.cache_clear()
        registry._rooms.clear()
        registry._rooms.update(kinds)
        sys.modules.pop("zero_output_plugin", None)


def test_a_kind_whose_name_is_taken_by_another_class_is_refused() -> None:
    from neuraldbg.kinds import Kind

    class Impostor(Kind):
        name = "dead_neurons"

    with pytest.raises(neuraldbg.ConfigError, match="'dead_neurons' is already registered by DeadNeurons"):
        registry.register(Impostor())
