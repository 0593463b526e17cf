"""A dead unit in the model's output layer is a fault at any fraction: a ReLU on a classifier's logits leaves some
classes never positive, their weight rows with exactly zero gradient, and the accuracy far below the same model
without it. Hidden layers keep the 70 % rule (a hidden layer may spare units).

Ground truth by plain torch: the output units never positive over the last ten steps, the weight rows of the last
Linear with exactly zero gradient, and the accuracy on held-out batches against the twin without the ReLU."""

from __future__ import annotations

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 150
BATCHES = support.classification_batches((20,), 10, batch=64)


def classifier(relu_on_logits: bool, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10)]
    if relu_on_logits:
        layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def run(model: nn.Sequential) -> tuple[NeuralDbg, int, int, float]:
    """Adam at 1e-2; returns the debugger, the output units never positive over the last ten steps, the weight rows
    of the last Linear with exactly zero gradient at the last step, and the held-out accuracy (plain torch)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    never = torch.ones(10, dtype=torch.bool)
    with NeuralDbg(model) as dbg:
        for step in range(STEPS):
            x, y = BATCHES(step)
            opt.zero_grad()
            out = model(x)
            F.cross_entropy(out, y).backward()
            opt.step()
            if step >= STEPS - 10:
                never &= (out > 0).sum(0) == 0
    zero_rows = int((model[2].weight.grad.abs().sum(1) == 0).sum())
    with torch.no_grad():
        x, y = BATCHES(10_000)
        accuracy = float((model(x).argmax(1) == y).float().mean())
    return dbg, int(never.sum()), zero_rows, accuracy


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_relu_on_the_logits_with_dead_classes_is_dead_neurons_at_the_output(seed: int) -> None:
    dbg, dead, zero_rows, accuracy = run(classifier(True, seed))
    _, twin_dead, _, twin_accuracy = run(classifier(False, seed))
    assert twin_dead == 0

    # plain torch: some (not most) output units never positive, their rows without gradient, accuracy lost
    assert 1 <= dead < 0.7 * 10 and zero_rows >= dead
    assert accuracy < twin_accuracy - 0.1

    # the ReLU before cross_entropy is proved from the loss graph (activation_before_loss, first: exact); the
    # output units it killed are its dead neurons, at the same layer
    first, *rest = dbg.hypotheses()
    assert first.kind is FailureKind.ACTIVATION_BEFORE_LOSS and first.root.layer == "3"
    top = next(h for h in rest if h.kind is FailureKind.DEAD_NEURONS)
    assert top.root.layer == "3" and top.root.metrics["output_layer"] == 1.0
    assert top.root.metrics["dead_units"] >= 1
    assert "remove the ReLU after the last layer" in top.explanation


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_twin_without_the_relu_is_silent(seed: int) -> None:
    dbg, _, zero_rows, _ = run(classifier(False, seed))
    assert zero_rows == 0
    assert dbg.hypotheses() == []


def test_a_hidden_layer_with_a_few_dead_units_stays_below_the_dead_layer_rule() -> None:
    """The same number of dead units in a hidden ReLU (bias -30 on 3 of 64 units: plain torch, never positive) is no
    fault: the layer keeps 95 % of its capacity and the model trains."""
    model = classifier(False)
    with torch.no_grad():
        model[0].bias[:3] = -30.0
    dbg, _, _, _ = run(model)
    hidden = support.capture_outputs(model, BATCHES(0)[0], ["1"])["1"]
    assert 0 < support.dead_unit_fraction(hidden) < 0.1
    assert FailureKind.DEAD_NEURONS.value not in support.kinds(dbg)


def test_dead_units_of_an_output_the_loss_leaves_at_zero_are_no_output_fault() -> None:
    """A forward-forward-style layer: its ReLU output is the model's output and the loss is its goodness (the mean
    square of the units, pushed up for real samples), whose gradient on a unit at 0 is 0. Three of 32 units never
    positive (bias -30) are spare capacity there, not outputs the model cannot produce."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
    with torch.no_grad():
        model[0].bias[:3] = -30.0
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    pulled_on_dead = 0.0
    with NeuralDbg(model) as dbg:
        for step in range(60):
            x, _ = BATCHES(step)
            opt.zero_grad()
            out = model(x)
            out.retain_grad()
            F.softplus(2.0 - out.pow(2).mean(1)).mean().backward()
            never = (out > 0).sum(0) == 0
            assert bool(never[:3].all())  # plain torch: the three units are never positive
            pulled_on_dead += float(out.grad[:, never].abs().sum())
            opt.step()
    assert pulled_on_dead == 0.0  # ... and the loss never pulls on them
    assert FailureKind.DEAD_NEURONS.value not in support.kinds(dbg)
