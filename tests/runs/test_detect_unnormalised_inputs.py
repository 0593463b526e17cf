"""Unnormalised inputs to a classifier (pixel-like values of 0-255 fed to a cross-entropy model whose first layer is
no normalisation layer). Ground truth is plain torch in each test: the same data standardised trains better, and
the raw run's first loss is far above log(classes); a regression on the same scale, a classifier that begins with
a BatchNorm, one that normalises its raw pixels inside its forward (its first layer sees rms ~1) and the
standardised twin stay silent."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
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


class Tabular(nn.Module):
    """Categorical ids and numeric columns, as tabular models take them: the ids come first, so the data argument
    (the call's first tensor) is not the one whose scale matters."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 4)
        self.fc1 = nn.Linear(4 + 32, 64)
        self.head = nn.Linear(64, CLASSES)

    def forward(self, ids: torch.Tensor, nums: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.fc1(torch.cat([self.emb(ids), nums], dim=1))))


def tabular(make: Callable[[int], support.Batch]) -> Callable[[int], tuple[tuple[torch.Tensor, ...], torch.Tensor]]:
    def batch(step: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        x, y = make(step)
        ids = torch.randint(0, 7, (len(y),), generator=torch.Generator().manual_seed(step))
        return (ids, x), y

    return batch


def train_args(model: nn.Module, make: Callable[[int], tuple[tuple[torch.Tensor, ...], torch.Tensor]], watched: bool):
    """The loop of :func:`train` for a model called with several arguments."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.__enter__()
    for step in range(STEPS):
        args, y = make(step)
        opt.zero_grad()
        loss = F.cross_entropy(model(*args), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    if dbg is not None:
        dbg.__exit__(None, None, None)
    with torch.no_grad():
        held = [make(10_000 + i) for i in range(4)]
        accuracy = sum(float((model(*a).argmax(1) == y).float().mean()) for a, y in held) / len(held)
    return losses, accuracy, dbg


def test_raw_numeric_columns_after_categorical_ids_are_found():
    make = support.classification_batches((32,), CLASSES, batch=64)
    torch.manual_seed(0)
    losses, accuracy, _ = train_args(Tabular(), tabular(raw(make)), watched=False)
    torch.manual_seed(0)
    _, twin_accuracy, _ = train_args(Tabular(), tabular(standardised(make)), watched=False)
    # plain torch: raw columns start far above log(classes) and end less accurate than standardised ones
    assert losses[0] > 3 * math.log(CLASSES)
    assert accuracy < twin_accuracy - 0.05

    torch.manual_seed(0)
    watched_losses, _, dbg = train_args(Tabular(), tabular(raw(make)), watched=True)
    assert watched_losses == losses  # the debugger changes nothing
    assert dbg is not None and dbg.hypotheses() and dbg.hypotheses()[0].kind.value == KIND, dbg.explain_failure()
    assert found(dbg)[0].root.metrics["input_rms"] > 100

    torch.manual_seed(0)
    _, _, healthy = train_args(Tabular(), tabular(standardised(make)), watched=True)
    assert healthy is not None and healthy.healthy, healthy.explain_failure()


class Pooled(nn.Module):
    """Attention pooling over 8 tokens of 4 features with an additive mask (0 kept, -1e9 masked) as its second
    argument: the mask's root-mean-square is ~5e8, and it is not data."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 16)
        self.score = nn.Linear(16, 1)
        self.head = nn.Linear(32 + 16, CLASSES)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x.view(len(x), 8, 4)))
        weights = torch.softmax(self.score(h).squeeze(-1) + mask, dim=1)
        return self.head(torch.cat([x, (weights.unsqueeze(-1) * h).sum(1)], dim=1))


def test_an_additive_mask_after_standardised_data_is_not_taken_for_data():
    make = support.classification_batches((32,), CLASSES, batch=64)
    mask = torch.zeros(64, 8)
    mask[:, 6:] = -1e9

    def masked(step: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        x, y = standardised(make)(step)
        return (x, mask), y

    torch.manual_seed(0)
    losses, accuracy, _ = train_args(Pooled(), masked, watched=False)
    # plain torch: it learns (a guess scores 0.1) and its loss falls
    assert accuracy > 0.2 and losses[-1] < 0.9 * losses[0]
    torch.manual_seed(0)
    _, _, dbg = train_args(Pooled(), masked, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()


class InForward(nn.Module):
    """A CNN classifier fed raw 0-255 pixels that, like an Atari agent or a torchvision-style Normalize inside the
    model, scales them to 0-1 and standardises them with registered buffers at the top of its forward
    (``normalise=False``: the same model, fed the raw pixels)."""

    def __init__(self, normalise: bool = True) -> None:
        super().__init__()
        self.normalise = normalise
        self.register_buffer("mean", torch.tensor(128 / 255))
        self.register_buffer("std", torch.tensor(50 / 255))
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.head = nn.Linear(8 * 64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.normalise:
            x = (x / 255.0 - self.mean) / self.std
        return self.head(F.relu(self.conv(x)).flatten(1))


def first_layer_rms(model: InForward, x: torch.Tensor) -> float:
    """Plain torch: the root-mean-square of what the first convolution is given."""
    seen: list[float] = []
    handle = model.conv.register_forward_pre_hook(lambda _, args: seen.append(float(args[0].pow(2).mean().sqrt())))
    with torch.no_grad():
        model(x)
    handle.remove()
    return seen[0]


def test_a_classifier_that_normalises_its_raw_pixels_in_its_forward_is_silent():
    make = support.classification_batches((1, 8, 8), CLASSES, batch=64)
    torch.manual_seed(0)
    losses, accuracy, _ = train(InForward(), raw(make), F.cross_entropy, watched=False)
    torch.manual_seed(0)
    twin_losses, twin_accuracy, _ = train(InForward(normalise=False), standardised(make), F.cross_entropy, False)
    # plain torch: the model's input is 0-255 pixels, its first layer sees standardised ones (the twin's very input,
    # to rounding) and it trains exactly as well as the twin fed standardised data
    x = raw(make)(0)[0]
    assert float(x.pow(2).mean().sqrt()) > 100
    assert 0.5 < first_layer_rms(InForward(), x) < 2
    assert accuracy > twin_accuracy - 0.02 and accuracy > 0.5
    assert losses[0] < 1.5 * math.log(CLASSES) and abs(losses[0] - twin_losses[0]) < 1e-3

    torch.manual_seed(0)
    watched_losses, _, dbg = train(InForward(), raw(make), F.cross_entropy, watched=True)
    assert watched_losses == losses  # the debugger changes nothing
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert dbg._recorder.coverage.training.median("input_rms") < 2  # the scale the first layer saw


def test_the_same_classifier_without_its_normalisation_in_forward_is_found():
    make = support.classification_batches((1, 8, 8), CLASSES, batch=64)
    torch.manual_seed(0)
    losses, accuracy, _ = train(InForward(normalise=False), raw(make), F.cross_entropy, watched=False)
    torch.manual_seed(0)
    _, twin_accuracy, _ = train(InForward(), raw(make), F.cross_entropy, watched=False)
    # plain torch: the raw pixels reach the convolution; it starts far above log(classes) and ends less accurate
    assert first_layer_rms(InForward(normalise=False), raw(make)(0)[0]) > 100
    assert losses[0] > 3 * math.log(CLASSES)
    assert accuracy < twin_accuracy - 0.05

    torch.manual_seed(0)
    _, _, dbg = train(InForward(normalise=False), raw(make), F.cross_entropy, watched=True)
    assert dbg is not None and found(dbg), dbg.explain_failure()
    assert found(dbg)[0].root.metrics["input_rms"] > 100


class WithMetadata(nn.Module):
    """Raw 0-255 pixels and standardised metadata: a side branch of six linear layers reads the metadata first, then
    the pixels enter the convolution as they were given (past the first layer calls with parameters: the
    convolution's input is read because no parameter has touched it)."""

    def __init__(self) -> None:
        super().__init__()
        self.meta = nn.Sequential(nn.Linear(4, 16), *(m for _ in range(5) for m in (nn.ReLU(), nn.Linear(16, 16))))
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.head = nn.Linear(8 * 64 + 16, CLASSES)

    def forward(self, x: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
        side = F.relu(self.meta(meta))
        return self.head(torch.cat([F.relu(self.conv(x)).flatten(1), side], dim=1))


def test_raw_pixels_that_enter_a_convolution_after_a_metadata_branch_are_found():
    make = support.classification_batches((1, 8, 8), CLASSES, batch=64)

    def batches(scale: Callable[[Callable[[int], support.Batch]], Callable[[int], support.Batch]]):
        def batch(step: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
            x, y = scale(make)(step)
            meta = torch.randn(len(y), 4, generator=torch.Generator().manual_seed(step))
            return (x, meta), y

        return batch

    torch.manual_seed(0)
    losses, accuracy, _ = train_args(WithMetadata(), batches(raw), watched=False)
    torch.manual_seed(0)
    _, twin_accuracy, _ = train_args(WithMetadata(), batches(standardised), watched=False)
    # plain torch: the raw pixels start far above log(classes) and end less accurate than standardised ones
    assert losses[0] > 3 * math.log(CLASSES)
    assert accuracy < twin_accuracy - 0.05

    torch.manual_seed(0)
    _, _, dbg = train_args(WithMetadata(), batches(raw), watched=True)
    assert dbg is not None and found(dbg), dbg.explain_failure()
    assert found(dbg)[0].root.metrics["input_rms"] > 100


ACCUMULATION_STEPS = 1  # a script's gradient accumulation left at its default


def mse_per_accumulation_step(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``loss / accumulation_steps``, as scripts write it whatever the number of steps: here 1, the loss itself."""
    return F.mse_loss(prediction, target) / ACCUMULATION_STEPS


@pytest.mark.parametrize(
    ("loss_fn", "named"),
    [(F.mse_loss, "mse_loss"), (F.smooth_l1_loss, "a Huber loss"), (mse_per_accumulation_step, "mse_loss")],
)
def test_a_regression_of_unit_scale_targets_from_raw_inputs_is_found(loss_fn, named: str):
    """Raw features (x 100 + 400, root-mean-square ~400) regressed onto standardised targets (variance ~1): the
    output must come out near unit scale, not on the inputs' (as a diffusion model's noise prediction must)."""
    base = support.regression_batches(32, batch=64, scale=0.2)

    def raw_make(step: int) -> support.Batch:
        x, y = base(step)
        return x * 100 + 400, y

    def r2(model: nn.Module, make: Callable[[int], support.Batch]) -> float:
        x, y = make(10_000)
        with torch.no_grad():
            return float(1 - F.mse_loss(model(x), y) / y.var())

    def run(make: Callable[[int], support.Batch], watched: bool) -> tuple[nn.Module, list[float], NeuralDbg | None]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
        losses, _, dbg = train(model, make, loss_fn, watched)
        return model, losses, dbg

    _, y = base(0)
    assert y.var() < 4  # the targets are near unit scale
    raw_model, losses, _ = run(raw_make, watched=False)
    good_model, _, _ = run(base, watched=False)
    assert r2(raw_model, raw_make) < r2(good_model, base) - 0.3  # plain torch: the raw inputs fit far worse

    _, watched, dbg = run(raw_make, watched=True)
    assert watched == losses
    assert dbg is not None and found(dbg) and dbg.hypotheses()[0].kind.value == KIND, dbg.explain_failure()
    assert f"a regression whose targets lie near unit scale (its loss, {named}," in found(dbg)[0].explanation
    _, _, twin = run(base, watched=True)
    assert twin is not None and not found(twin), twin.explain_failure()
