"""Structural checks every scenario set must pass, shared by the calibration and the held-out tests."""

from __future__ import annotations

import torch

from benchmarks.scenarios.base import Scenario

ARCHS = {"tiny", "mlp", "cnn", "resnet", "rnn", "transformer"}


def assert_well_formed(scenario: Scenario) -> None:
    """A known architecture, one-sentence description, and a ground truth that names real layers and steps."""
    t = scenario.truth
    assert scenario.arch in ARCHS
    assert not (t.kinds & t.may_also)
    assert scenario.description.endswith(".") and scenario.description.count(". ") <= 1
    run = scenario.build()
    modules = dict(run.model.named_modules())
    if t.healthy:
        assert t.root_layers is None and t.onset is None and not t.may_also
    if t.root_layers is not None:
        assert t.root_layers, "an empty root set accepts nothing"
        assert t.root_layers <= modules.keys(), f"unknown root layers {sorted(t.root_layers - modules.keys())}"
    if t.onset is not None:
        assert 0 <= t.onset[0] <= t.onset[1] < run.steps


def assert_deterministic(scenario: Scenario) -> None:
    """Two builds give the same weights and the same batches, which depend on the step alone (NaN labels compare
    equal to themselves)."""
    first, second = scenario.build(), scenario.build()
    for step in (0, first.steps - 1):
        (x1, y1), (x2, y2) = first.batch(step), second.batch(step)
        assert torch.equal(x1, x2)
        assert (
            torch.allclose(y1, y2, rtol=0.0, atol=0.0, equal_nan=True)
            if y1.is_floating_point()
            else torch.equal(y1, y2)
        )
    x_again, _ = first.batch(0)  # the same after other steps were drawn
    assert torch.equal(x_again, second.batch(0)[0])
    state1, state2 = first.model.state_dict(), second.model.state_dict()
    assert state1.keys() == state2.keys()
    assert all(torch.equal(state1[k], state2[k]) for k in state1)
