"""Units that never fire in a layer that does not train are no dead-neuron fault, and a model with no trainable
parameter, an input optimised through it, is said to have no training to judge.

Style transfer optimises an image through a frozen feature net (``requires_grad_(False)``): nothing of the net is
learned, so channels that never fire on these images harm no training. Dead units are a fault of a layer that
trains: the same net trained (its parameters in the optimizer) still has dead output units, and a frozen backbone's
dead units are left alone while a trained copy of it is still a dead layer.

Ground truth by plain torch in each test: the channels or units really never positive, the frozen parameters
unchanged and without gradient, the image (or head) moved and the loss fell; in the twins, the dead units' weight
rows with exactly zero gradient."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

DEAD_CHANNELS = 3  # channels of the last convolution whose bias holds them below zero on every input


def feature_net() -> nn.Sequential:
    """A small VGG-like net ending in a ReLU, three of its last channels off on every input (bias -30)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
    with torch.no_grad():
        net[2].bias[:DEAD_CHANNELS] = -30.0
    return net


def never_positive(out: torch.Tensor) -> torch.Tensor:
    return out.detach().amax(dim=(0, 2, 3)) <= 0


def optimise_image(net: nn.Sequential, whole: bool, steps: int = 60) -> tuple[NeuralDbg, list[float], torch.Tensor]:
    """Adam on an image matched to a target's features through the frozen ``net``, called whole or layer by layer;
    returns the debugger, the losses and the channels never positive at every step."""
    net.requires_grad_(False)
    before = [p.detach().clone() for p in net.parameters()]
    target = torch.rand(1, 16, 16, 16, generator=torch.Generator().manual_seed(1))
    image = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
    opt = torch.optim.Adam([image], lr=0.02)
    losses, never = [], torch.ones(16, dtype=torch.bool)
    with NeuralDbg(net) as dbg:
        for _ in range(steps):
            h = image
            if whole:
                h = net(h)
            else:
                for layer in net:
                    h = layer(h)
            loss = F.mse_loss(h, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            never &= never_positive(h)
    # plain torch: the net has no trainable parameter, got no gradient and did not move; the image was learned
    assert not any(p.requires_grad or p.grad is not None for p in net.parameters())
    assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before))
    assert losses[-1] < 0.9 * losses[0]
    return dbg, losses, never


def test_an_image_optimised_through_a_frozen_net_called_whole_has_no_dead_units_and_no_training_to_judge() -> None:
    dbg, _, never = optimise_image(feature_net(), whole=True)
    assert int(never.sum()) >= DEAD_CHANNELS  # plain torch: output channels never positive at any step
    assert FailureKind.DEAD_NEURONS.value not in support.kinds(dbg)
    (found,) = dbg.hypotheses()
    assert found.kind is FailureKind.NO_TRAINING_OBSERVED
    assert "no trainable parameter" in found.explanation and "60 optimizer steps" in found.explanation
    assert "loss.backward()" not in found.explanation


def test_the_same_net_called_layer_by_layer_is_explained_without_a_missing_backward_pass() -> None:
    """The model's own forward never runs whole, so its pass counts say little: the explanation names what is
    true (no trainable parameter; the optimizer stepped something else), not a missing backward pass."""
    dbg, _, _ = optimise_image(feature_net(), whole=False)
    (found,) = dbg.hypotheses()
    assert found.kind is FailureKind.NO_TRAINING_OBSERVED
    assert "no trainable parameter" in found.explanation and "60 optimizer steps" in found.explanation
    assert "no backward pass" not in found.explanation and "call loss.backward()" not in found.explanation


def test_the_same_net_trained_keeps_its_dead_output_units() -> None:
    """The twin where the units' layer trains: its parameters in the optimizer, fitted to the same target. The
    three channels stay off, their weight rows get exactly zero gradient while the loss pulls on them."""
    net = feature_net()
    target = torch.rand(1, 16, 16, 16, generator=torch.Generator().manual_seed(1))
    x = torch.rand(8, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    never = torch.ones(16, dtype=torch.bool)
    with NeuralDbg(net) as dbg:
        for _ in range(60):
            out = net(x)
            opt.zero_grad()
            F.mse_loss(out, target.expand_as(out)).backward()
            opt.step()
            never &= never_positive(out)
    rows = net[2].weight.grad.flatten(1).abs().sum(1)
    assert bool(never[:DEAD_CHANNELS].all()) and bool((rows[:DEAD_CHANNELS] == 0).all())  # plain torch
    found = next(h for h in dbg.hypotheses() if h.kind is FailureKind.DEAD_NEURONS)
    assert found.root.layer == "3" and found.root.metrics["output_layer"] == 1.0


BATCHES = support.classification_batches((20,), 4, batch=64)
DEAD_HIDDEN = 60  # of the backbone's 64 ReLU units, held off on every input (bias -30)


def backbone_and_head(frozen: bool) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    with torch.no_grad():
        model[0].bias[:DEAD_HIDDEN] = -30.0
    model[0].requires_grad_(not frozen)
    return model


def train_classifier(model: nn.Sequential) -> tuple[NeuralDbg, list[float], float]:
    """Adam on the parameters that train; the debugger, the losses and the share of the ReLU's units never
    positive on a batch (plain torch)."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    with NeuralDbg(model) as dbg:
        for step in range(80):
            x, y = BATCHES(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    hidden = support.capture_outputs(model, BATCHES(0)[0], ["1"])["1"]
    return dbg, losses, support.dead_unit_fraction(hidden)


def test_dead_units_of_a_frozen_backbone_under_a_trained_head_are_no_fault() -> None:
    model = backbone_and_head(frozen=True)
    before = model[0].weight.detach().clone()
    dbg, losses, dead = train_classifier(model)
    # plain torch: the backbone's units are off as set, it got no gradient and did not move; the head learned
    assert dead >= DEAD_HIDDEN / 64 and model[0].weight.grad is None and torch.equal(model[0].weight, before)
    assert sum(losses[-10:]) < sum(losses[:10])
    assert FailureKind.DEAD_NEURONS.value not in support.kinds(dbg)


def test_the_same_backbone_trained_is_still_a_dead_layer() -> None:
    model = backbone_and_head(frozen=False)
    dbg, _, dead = train_classifier(model)
    rows = model[0].weight.grad.abs().sum(1)
    assert dead >= DEAD_HIDDEN / 64 and bool((rows[:DEAD_HIDDEN] == 0).all())  # plain torch
    found = next(h for h in dbg.hypotheses() if h.kind is FailureKind.DEAD_NEURONS)
    assert found.root.layer == "1"
