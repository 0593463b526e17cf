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
