"""Extension through pluggy: a user adds a detector and a causal rule without forking."""

from __future__ import annotations

import support
import torch
from torch import nn

import neuraldbg
from neuraldbg import EventType, FailureKind, hookimpl
from neuraldbg.detectors import Detector, Finding, Observation
from neuraldbg.reasoning import CausalRule


class ConstantOutput(Detector):
    """The example from the hookspec docstring: a layer whose output is all zeros."""

    name = "constant_output"
    event_type = EventType.ACTIVATION

    def observe(self, view):  # type: ignore[no-untyped-def]
        obs = Observation()
        for (layer, call), norm in view.data.act.items():
            obs.saw(self.event_type, layer, call=call)
            if norm == 0.0:
                obs.findings.append(
                    Finding(self.event_type, None, layer, "constant", {"output_norm": norm}, strength=1.0, call=call)
                )
        return obs


class Plugin:
    @hookimpl
    def neuraldbg_detectors(self, config):  # type: ignore[no-untyped-def]
        return [ConstantOutput()]

    @hookimpl
    def neuraldbg_causal_rules(self):  # type: ignore[no-untyped-def]
        return [CausalRule("dead-explains-constant", "makes constant", FailureKind.DEAD_NEURONS, (None,), "any")]


def dead_model() -> nn.Sequential:
    torch.manual_seed(0)
    model = support.mlp(width=16, depth=2)
    with torch.no_grad():
        model[2].bias.fill_(-30.0)
    return model


def test_a_plugin_detector_adds_events_and_a_plugin_rule_links_them():
    model = dead_model()
    with neuraldbg.NeuralDbg(model, plugins=[Plugin()]) as dbg:
        opt = torch.optim.Adam(model.parameters())
        for step in range(10):
            x, y = support.regression_batches()(step)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    constant = [e for e in dbg.events if e.to_state == "constant"]
    assert {e.layer for e in constant} == {"3"}
    (h,) = dbg.hypotheses()
    assert any(c.relation == "makes constant" and c.effect.layer == "3" for c in h.couplings)


def test_a_registered_plugin_applies_to_every_new_debugger_until_unregistered():
    plugin = Plugin()
    neuraldbg.register_plugin(plugin)
    try:
        dbg, _ = support.train(dead_model(), support.regression_batches(), steps=5)
        assert any(e.to_state == "constant" for e in dbg.events)
    finally:
        neuraldbg.unregister_plugin(plugin)
    dbg, _ = support.train(dead_model(), support.regression_batches(), steps=5)
    assert not any(e.to_state == "constant" for e in dbg.events)


class OtherPlugin:
    """A second plugin with a detector of its own, to tell which of two plugins a debugger holds."""

    @hookimpl
    def neuraldbg_detectors(self, config):  # type: ignore[no-untyped-def]
        detector = ConstantOutput()
        detector.name = "other_constant_output"
        return [detector]


def detector_names(dbg: neuraldbg.NeuralDbg) -> set[str]:
    return {d.name for d in dbg._analyzer.detectors}


def test_debuggers_share_the_plugin_manager_only_while_their_plugins_are_the_same_objects():
    from neuraldbg.plugins import manager

    assert manager.manager() is manager.manager()  # made once for debuggers without plugins of their own
    first, second = Plugin(), OtherPlugin()
    neuraldbg.register_plugin(first)
    try:
        assert "constant_output" in detector_names(neuraldbg.NeuralDbg(dead_model()))
    finally:
        neuraldbg.unregister_plugin(first)
    neuraldbg.register_plugin(second)  # as many plugins as before, another one
    try:
        names = detector_names(neuraldbg.NeuralDbg(dead_model()))
        assert "other_constant_output" in names and "constant_output" not in names
    finally:
        neuraldbg.unregister_plugin(second)
    assert not {"constant_output", "other_constant_output"} & detector_names(neuraldbg.NeuralDbg(dead_model()))
    # a debugger's own plugins stay its own: the next debugger without plugins does not get them
    assert "constant_output" in detector_names(neuraldbg.NeuralDbg(dead_model(), plugins=[Plugin()]))
    assert "constant_output" not in detector_names(neuraldbg.NeuralDbg(dead_model()))
    # and each debugger gets fresh detectors (they hold a run's state) from the shared manager
    a, b = neuraldbg.NeuralDbg(dead_model()), neuraldbg.NeuralDbg(dead_model())
    assert not {id(d) for d in a._analyzer.detectors} & {id(d) for d in b._analyzer.detectors}


def test_the_rules_resolved_once_are_given_anew_to_each_debugger_and_again_when_a_kind_is_redefined(monkeypatch):
    import neuraldbg.kinds as kinds
    from neuraldbg.kinds import registry

    resolved = []
    resolve = kinds._rules
    monkeypatch.setattr(kinds, "_rules", lambda chosen: resolved.append(len(chosen)) or resolve(chosen))
    monkeypatch.setattr(kinds, "_resolved", None)
    first, second = kinds.rules(), kinds.rules()
    assert resolved == [len(kinds.rooms())]  # resolved once
    assert first == second and first is not second  # each a list of its own: a debugger may extend it
    first.clear()
    assert kinds.rules() == second
    assert kinds.rules(kinds.rooms()[1:]) != second and len(resolved) == 2  # other kinds: resolved for them
    chosen = kinds.rooms()
    kinds.rules(chosen)
    assert len(resolved) == 3
    room = chosen[0]
    cls = type(room)
    redefined = type(cls.__name__, (cls,), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
    try:
        registry.register(redefined())  # a module reloaded: its class defined again replaces the room
        kinds.rules(chosen)  # the same kinds, the registry moved under them: resolved again
        assert len(resolved) == 4
    finally:
        registry.register(room)
