"""Unnormalised inputs to a classifier (pixel-like values of 0-255 fed to a cross-entropy model whose first layer is
no normalisation layer). Ground truth is plain torch in each test: the same data standardised trains better, and
the raw run's first loss is far above log(classes); a regression on the same scale, a classifier that begins with
a BatchNorm and the standardised twin stay silent."""

from __future__ import annotations

import math
from collections.abc import Callable

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

CLASSES = 10
KIND = "unnormalised_inputs"
STEPS = 80


def raw(make: Callable[[int], support.Batch]) -> Callable[[int], support.Batch]:
    """The same batches as 0-255 pixel-like values (an affine map: the labels stay as learnable)."""

    def batch(step: int) -> support.Batch:
        x, y = make(step)
        return (x * 50 + 128).clamp(0, 255), y

    return batch


def standardised(make: Callable[[int], support.Batch]) -> Callable[[int], support.Batch]:
    """What Normalize(mean, std) gives for the raw batches."""

    def batch(step: int) -> support.Batch:
        x, y = raw(make)(step)
        return (x - 128) / 50, y

    return batch


def classifier(first_norm: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = [nn.BatchNorm1d(32)] if first_norm else []
    return nn.Sequential(*layers, nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def train(
    model: nn.Module,
    make: Callable[[int], support.Batch],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    watched: bool,
) -> tuple[list[float], float, NeuralDbg | None]:
    """A user's loop (no NeuralDBG call inside), Adam 1e-3: the losses and the accuracy on held-out batches."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []

    def loop() -> None:
        for step in range(STEPS):
            x, y = make(step)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))

    if watched:
        with NeuralDbg(model) as dbg:
            loop()
    else:
        dbg = None
        loop()
    model.eval()
    with torch.no_grad():
        held = [make(10_000 + i) for i in range(4)]
        accuracy = sum(float((model(x).argmax(1) == y).float().mean()) for x, y in held) / len(held)
    return losses, accuracy, dbg


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_a_classifier_fed_raw_pixel_values_is_found_and_its_standardised_twin_is_silent():
    make = support.classification_batches((32,), CLASSES, batch=64)
    torch.manual_seed(0)
    losses, accuracy, _ = train(classifier(), raw(make), F.cross_entropy, watched=False)
    torch.manual_seed(0)
    twin_losses, twin_accuracy, _ = train(classifier(), standardised(make), F.cross_entropy, watched=False)
    # plain torch: the raw run starts far above log(classes) (logits ~50 times too large) and ends less accurate
    assert losses[0] > 3 * math.log(CLASSES)
    assert twin_losses[0] < 1.5 * math.log(CLASSES)
    assert accuracy < twin_accuracy - 0.05

    torch.manual_seed(0)
    _, _, dbg = train(classifier(), raw(make), F.cross_entropy, watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND
    assert hits[0].root.metrics["input_rms"] > 100
    assert "Normalize" in hits[0].explanation

    torch.manual_seed(0)
    _, _, healthy = train(classifier(), standardised(make), F.cross_entropy, watched=True)
    assert healthy is not None and healthy.healthy, healthy.explain_failure()


def test_a_regression_on_the_same_scale_is_not_judged():
    """0-255 inputs and 0-255 targets (a super-resolution's setting): the output lives on the input's scale."""
    base = support.regression_batches(32, batch=64)

    def make(step: int) -> support.Batch:
        x, y = base(step)
        return (x * 50 + 128).clamp(0, 255), y * 20 + 128

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    torch.manual_seed(0)
    _, _, dbg = train(model, make, F.mse_loss, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert dbg._recorder.coverage.training.median("input_rms") > 100  # the scale was seen, and is not a finding


def test_a_classifier_that_begins_with_a_batchnorm_normalises_its_inputs_itself():
    make = support.classification_batches((32,), CLASSES, batch=64)
    torch.manual_seed(0)
    _, accuracy, _ = train(classifier(first_norm=True), raw(make), F.cross_entropy, watched=False)
    torch.manual_seed(0)
    _, twin_accuracy, _ = train(classifier(), standardised(make), F.cross_entropy, watched=False)
    assert accuracy > twin_accuracy - 0.05  # plain torch: as good as the standardised twin

    torch.manual_seed(0)
    _, _, dbg = train(classifier(first_norm=True), raw(make), F.cross_entropy, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
