"""Images already in [0, 1] divided by 255 again (root-mean-square about 0.002): the first convolution's
pre-activations are almost its bias alone, so every unit whose bias is negative is off on every image from the
start. The finding is the dead units, and its fix is the inputs' scale, not an initialisation. Ground truth is plain
torch: the input's scale, the pre-activations against the bias, the dead units against the negative biases, and the
held-out accuracy against the twin fed the images in [0, 1]."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.kinds import loss_evidence

TEMPLATES = torch.randn(10, 1, 8, 8, generator=torch.Generator().manual_seed(321))
STEPS = 150


def images(n: int, seed: int, divided_twice: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy 8x8 templates of 10 classes, scaled to [0, 1] (and by 1/255 once more when ``divided_twice``)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = TEMPLATES[y] * 0.45 + torch.randn(n, 1, 8, 8, generator=g)
    x = ((x + 4) / 8).clamp(0, 1)
    return (x / 255 if divided_twice else x), y


def cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(128, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def train(divided_twice: bool, watched: bool) -> tuple[nn.Sequential, NeuralDbg | None]:
    model = cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = images(STEPS * 32, 1, divided_twice)

    def loop() -> None:
        for i in range(STEPS):
            opt.zero_grad()
            F.cross_entropy(model(x[i * 32 : (i + 1) * 32]), y[i * 32 : (i + 1) * 32]).backward()
            opt.step()

    if not watched:
        loop()
        return model, None
    with NeuralDbg(model) as dbg:
        loop()
    return model, dbg


@torch.no_grad()
def accuracy(model: nn.Module, divided_twice: bool) -> float:
    x, y = images(1000, 2, divided_twice)
    return float((model(x).argmax(1) == y).float().mean())


@torch.no_grad()
def test_the_fault_in_plain_torch():
    x, _ = images(256, 1, divided_twice=True)
    assert float(x.pow(2).mean().sqrt()) <= loss_evidence.FAINT_INPUT_RMS
    conv = cnn()[0]
    pre = conv(x)
    bias = conv.bias.view(1, -1, 1, 1)
    assert float((pre - bias).abs().max()) < 0.05 * float(conv.bias.abs().median())  # the bias alone, nearly
    dead = (pre <= 0).all(3).all(2).all(0)
    assert torch.equal(dead, conv.bias <= 0) and dead.float().mean() > 0.25


def test_inputs_divided_twice_are_told_to_be_rescaled_and_the_twin_is_silent():
    wrong, dbg = train(divided_twice=True, watched=True)
    right, twin = train(divided_twice=False, watched=True)
    assert accuracy(wrong, True) < accuracy(right, False) - 0.1, (accuracy(wrong, True), accuracy(right, False))
    assert dbg is not None and twin is not None
    found = dbg.hypotheses()
    assert found and found[0].kind is FailureKind.DEAD_NEURONS and found[0].root.layer == "1", dbg.report()
    assert "far below unit scale" in found[0].explanation
    assert found[0].suggestion.startswith("scale the inputs to about unit scale"), found[0].suggestion
    assert twin.healthy, twin.report()


def test_units_dead_from_a_negative_bias_on_inputs_of_unit_scale_keep_the_initialisation_fix():
    """The same first layer, its biases set to -3 on inputs in [0, 1]: dead from the start for its own reason."""
    model = cnn()
    with torch.no_grad():
        model[0].bias.fill_(-3.0)
    x, y = images(STEPS * 32, 1, divided_twice=False)
    assert bool((model[0](x[:256]) <= 0).all())  # plain torch: every unit off on every image
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model) as dbg:
        for i in range(60):
            opt.zero_grad()
            F.cross_entropy(model(x[i * 32 : (i + 1) * 32]), y[i * 32 : (i + 1) * 32]).backward()
            opt.step()
    found = [h for h in dbg.hypotheses() if h.kind is FailureKind.DEAD_NEURONS and h.root.layer == "1"]
    assert found, dbg.report()
    assert "far below unit scale" not in found[0].explanation
    assert "check its initialisation and bias" in found[0].suggestion
