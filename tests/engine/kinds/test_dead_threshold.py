"""The dead-layer threshold is the one the rule states: a layer is dead when ``dead_unit_fraction`` (70 %) of its
units are, not when it crosses ``dead_onset_fraction`` (50 %), which only dates the event.

Replacing the threshold by the onset fraction passed every engine test before this file; each case builds a
layer with a known fraction of units that are never positive (a bias of -30 on those units, +3 on the others),
checked with plain torch, and trains it long enough for persistence to decide.
"""

from __future__ import annotations

import pytest
import support
import torch
from torch import nn

from neuraldbg import FailureKind

UNITS = 20


def model_with_dead_fraction(fraction: float) -> nn.Sequential:
    torch.manual_seed(0)
    model = support.mlp(width=UNITS, depth=2)
    dead = round(fraction * UNITS)
    with torch.no_grad():
        model[2].bias[:dead] = -30.0  # never positive for these inputs
        model[2].bias[dead:] = 3.0  # positive for most samples
    return model


def never_positive_fraction(model: nn.Sequential) -> float:
    x, _ = support.regression_batches()(0)
    with torch.no_grad():
        out = model[:4](x)  # the output of the second ReLU
    return float((out.amax(dim=0) <= 0).float().mean())


@pytest.mark.parametrize(("fraction", "dead"), [(0.6, False), (0.65, False), (0.75, True), (0.9, True)])
def test_a_layer_is_dead_from_the_rules_fraction_not_from_the_onset_fraction(fraction: float, dead: bool) -> None:
    model = model_with_dead_fraction(fraction)
    assert never_positive_fraction(model) == pytest.approx(fraction)  # the ground truth, in plain torch
    dbg, _ = support.train(
        model, support.regression_batches(), steps=30, optimizer=torch.optim.SGD(model.parameters(), lr=0.0)
    )
    kinds = {h.kind for h in dbg.hypotheses()}
    assert (FailureKind.DEAD_NEURONS in kinds) is dead, dbg.report()
    if dead:
        root = next(h.root for h in dbg.hypotheses() if h.kind is FailureKind.DEAD_NEURONS)
        assert root.layer == "3" and root.metrics["dead_fraction"] == pytest.approx(fraction)


@pytest.mark.parametrize(("units", "dead_units", "dead"), [(4, 3, False), (4, 4, True), (8, 6, False), (8, 7, True)])
def test_a_narrow_layer_is_dead_only_with_more_dead_units_than_chance_gives_it(
    units: int, dead_units: int, dead: bool
) -> None:
    """3 of 4 units (75 %) off on every sample happen by chance in 5 of 16 healthy initialisations of a
    squeeze-and-excitation bottleneck, whose non-negative pooled inputs fix each unit's sign; 4 of 4 is a layer
    that passes nothing."""
    torch.manual_seed(0)
    model = support.mlp(width=units, depth=2)
    with torch.no_grad():
        model[2].bias[:dead_units] = -30.0
        model[2].bias[dead_units:] = 3.0
    x, _ = support.regression_batches()(0)
    with torch.no_grad():
        out = model[:4](x)
    assert int((out.amax(dim=0) <= 0).sum()) == dead_units  # the ground truth, in plain torch
    dbg, _ = support.train(
        model, support.regression_batches(), steps=30, optimizer=torch.optim.SGD(model.parameters(), lr=0.0)
    )
    assert (FailureKind.DEAD_NEURONS in {h.kind for h in dbg.hypotheses()}) is dead, dbg.report()
