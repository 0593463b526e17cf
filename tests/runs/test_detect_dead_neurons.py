"""Dead neurons on models that truly have them (checked with plain torch): a layer killed by its bias, functional
and shared activations, convolution channels after batch norm, a layer that dies mid-run."""

from __future__ import annotations

import pytest
import support
import torch
import torch.nn.functional as F
from torch.nn.utils.parametrizations import spectral_norm, weight_norm

from neuraldbg import FailureKind

# --------------------------------------------------------------------------------------------- dead neurons


def test_a_relu_layer_killed_by_its_bias_is_dead_from_step_0_and_blamed_on_that_layer():
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=3)
    with torch.no_grad():
        model[2].bias.fill_(-20.0)
    batches = support.regression_batches()
    # ground truth with plain torch: every unit of ReLU '3' is zero on the first batch
    truth = support.capture_outputs(model, batches(0)[0], ["3"])["3"]
    assert support.dead_unit_fraction(truth) == 1.0

    dbg, _ = support.train(model, batches)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.DEAD_NEURONS
    assert top.root.layer == "3"
    assert top.root.step_start == 0
    assert top.root.metrics["dead_fraction"] == 1.0
    # the layers upstream of the dead one get exactly zero gradient: they are in its chain, not separate faults
    upstream = {e.layer for e in top.chain if e.kind is FailureKind.VANISHING_GRADIENTS}
    assert upstream == {"0", "2"}
    assert len(dbg.hypotheses()) == 1


@pytest.mark.parametrize("parametrized", [None, weight_norm, spectral_norm])
def test_dead_units_behind_a_functional_relu_are_found_on_the_layer_that_feeds_it(parametrized):
    """Also when the layer's weight is parametrized (weight_norm, spectral_norm): computed from tensors a
    parametrization holds, its rows still the units."""
    torch.manual_seed(0)
    model = support.FunctionalMLP()
    if parametrized is not None:
        model.fc2 = parametrized(model.fc2)
    with torch.no_grad():
        model.fc2.bias.fill_(-30.0)
    batches = support.regression_batches()
    pre = support.capture_outputs(model, batches(0)[0], ["fc2"])["fc2"]
    assert bool((pre <= 0).all())  # plain torch: F.relu zeroes every unit of fc2

    dbg, _ = support.train(model, batches)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.DEAD_NEURONS
    assert top.root.layer == "fc2"
    assert top.root.step_start == 0
    assert "fc1" in {e.layer for e in top.chain}


def test_a_shared_activation_module_is_judged_per_call():
    torch.manual_seed(0)
    model = support.SharedActMLP()
    with torch.no_grad():
        model.fc2.bias.fill_(-30.0)  # only the second use of `act` is dead

    dbg, _ = support.train(model, support.regression_batches())

    dead = [e for e in dbg.events if e.kind is FailureKind.DEAD_NEURONS]
    assert {(e.layer, e.metrics.get("call", 0.0)) for e in dead} == {("act", 1.0)}
    assert dbg.hypotheses()[0].root.layer == "act"


def test_dead_conv_channels_after_batchnorm_are_found_in_a_cnn():
    torch.manual_seed(0)
    model = support.cnn()
    with torch.no_grad():
        model[4].bias.fill_(-10.0)  # BN beta pushes every channel of the second block below zero
    batches = support.classification_batches((3, 8, 8), 10, batch=16)
    truth = support.capture_outputs(model, batches(0)[0], ["5"])["5"]
    assert support.dead_unit_fraction(truth) == 1.0

    dbg, _ = support.train(model, batches, F.cross_entropy, steps=20)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.DEAD_NEURONS
    assert top.root.layer in {"5", "4"}
    assert top.root.step_start == 0


def test_a_layer_that_dies_mid_run_is_dated_to_when_it_died():
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=3)
    batches = support.regression_batches()

    def kill(step: int, opt: torch.optim.Optimizer) -> None:
        if step == 30:
            with torch.no_grad():
                model[2].bias.fill_(-50.0)

    dbg, _ = support.train(model, batches, steps=70, on_step=kill)

    dead = [h for h in dbg.hypotheses() if h.kind is FailureKind.DEAD_NEURONS]
    assert dead, dbg.report()
    assert dead[0].root.layer == "3"
    assert 30 <= dead[0].root.step_start <= 34
