"""Class indices regressed with MSE: one output per sample, ``mse_loss`` against integer labels 0..C-1 of unordered
classes. Ground truth is plain torch in each test: the regression's rounded predictions are far less accurate than
a cross-entropy classifier's on the same data, and its loss ends above half of the target's variance. Silent twins
from other families: the classifier itself, an ordinal regression on integer counts that the model fits, a
regression on fractional values in the same range that fits as badly, a 0/1 target under MSE; and the debugger
leaves the training bit-identical. The same labels broadcast across a classifier's logits (``(N, 1)`` against
``(N, C)``) are found however well the loss fits them; one-hot targets of the logits' shape are silent."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.kinds.class_index_regression import UNEXPLAINED

KIND = "class_index_regression"
CLASSES = 10
FEATURES = 32
STEPS = 200
LR = 3e-3


def classes(step: int) -> support.Batch:
    """Unordered classes: the argmax of a fixed random linear teacher (class 3 is not 'between' 2 and 4)."""
    return support.classification_batches((FEATURES,), CLASSES, batch=64)(step)


def counts(step: int) -> support.Batch:
    """An ordinal integer target (0..9, a rating): a rounded, clipped linear score of the first 4 features, which
    the model can fit."""
    x, _ = classes(step)
    return x, (1.5 * x[:, :4].sum(dim=1) + 4.5).round().clamp(0, CLASSES - 1).long()


def fractions(step: int) -> support.Batch:
    """Fractional values in the class indices' range, mostly unpredictable: a poor regression, but of quantities."""
    x, _ = classes(step)
    g = torch.Generator().manual_seed(50_000 + step)
    return x, (4.5 + 0.3 * x[:, 0] + 2.5 * torch.randn(len(x), generator=g)).clamp(0, CLASSES - 1)


def binary(step: int) -> support.Batch:
    """A 0/1 target, 30 % of it flipped: MSE on it is a Brier score, fitted badly, and not a class-index
    regression."""
    x, y = classes(step)
    g = torch.Generator().manual_seed(60_000 + step)
    noise = torch.rand(len(x), generator=g) < 0.3
    return x, (y < 5).long() ^ noise.long()


def regressor() -> nn.Sequential:
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1))


def mse_on_values(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.squeeze(1), y.float())


def train(
    model: nn.Module,
    make: Callable[[int], support.Batch],
    loss_fn: Callable[..., torch.Tensor],
    watched: bool,
    lr: float = LR,
    steps: int = STEPS,
) -> tuple[list[float], NeuralDbg | None]:
    """A user's loop (no NeuralDBG call inside), Adam: the loss of each step."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses: list[float] = []

    def loop() -> None:
        for step in range(steps):
            x, y = make(step)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))

    if not watched:
        loop()
        return losses, None
    with NeuralDbg(model) as dbg:
        loop()
    return losses, dbg


def accuracy(model: nn.Module, predict: Callable[[torch.Tensor], torch.Tensor]) -> float:
    model.eval()
    with torch.no_grad():
        held = [classes(10_000 + i) for i in range(4)]
        return sum(float((predict(model(x)) == y).float().mean()) for x, y in held) / len(held)


def rounded(out: torch.Tensor) -> torch.Tensor:
    return out.squeeze(1).round().clamp(0, CLASSES - 1).long()


def end_over_variance(losses: list[float], make: Callable[[int], support.Batch]) -> float:
    """The mean loss of the last quarter over the target's variance (the MSE of predicting its mean)."""
    tail = losses[-len(losses) // 4 :]
    target = torch.cat([make(i)[1].float() for i in range(8)])
    return sum(tail) / len(tail) / float(target.var(correction=0))


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_class_indices_regressed_with_mse_are_found_and_the_classifier_twin_is_silent():
    torch.manual_seed(0)
    model = regressor()
    losses, _ = train(model, classes, mse_on_values, watched=False)
    regression_accuracy = accuracy(model, rounded)
    torch.manual_seed(0)
    twin = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    train(twin, classes, F.cross_entropy, watched=False)
    classifier_accuracy = accuracy(twin, lambda out: out.argmax(1))
    # plain torch: the regression leaves more than half the target's variance and classifies far worse
    ratio = end_over_variance(losses, classes)
    assert 0.5 < ratio < 1.0, ratio
    assert regression_accuracy < classifier_accuracy - 0.3, (regression_accuracy, classifier_accuracy)

    torch.manual_seed(0)
    _, dbg = train(regressor(), classes, mse_on_values, watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND
    m = hits[0].root.metrics
    assert (m["low"], m["high"]) == (0.0, CLASSES - 1.0)
    assert abs(m["unexplained"] - ratio) < 0.1
    assert "cross_entropy" in hits[0].suggestion

    torch.manual_seed(0)
    _, healthy = train(
        nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES)), classes, F.cross_entropy, True
    )
    assert healthy is not None and healthy.healthy, healthy.explain_failure()


def test_an_ordinal_count_the_model_fits_is_silent():
    torch.manual_seed(0)
    losses, _ = train(regressor(), counts, mse_on_values, watched=False)
    ratio = end_over_variance(losses, counts)
    assert 0.02 < ratio < 0.5, ratio  # plain torch: the fit explains most of the count's variance (not all of it)

    torch.manual_seed(0)
    _, dbg = train(regressor(), counts, mse_on_values, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    integer, low, high, _ = dbg._recorder.coverage.regression_target
    assert (integer, low, high) == (1.0, 0.0, 9.0)  # the integer target was seen, and fits


def test_an_ordinal_count_stopped_before_it_learnt_its_mean_is_left_to_the_loss_rooms():
    """The same count regression, a fifth as long at a third of the learning rate: its loss is still above the
    target's variance (it has not learnt the mean yet), so how well it would fit cannot be judged."""
    torch.manual_seed(0)
    losses, _ = train(regressor(), counts, mse_on_values, watched=False, lr=1e-3, steps=80)
    assert end_over_variance(losses, counts) > 1.0  # plain torch: worse than predicting the mean

    torch.manual_seed(0)
    _, dbg = train(regressor(), counts, mse_on_values, watched=True, lr=1e-3, steps=80)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert dbg._recorder.coverage.regression_target[:3] == (1.0, 0.0, 9.0)


def test_a_poor_regression_on_fractional_values_is_not_class_indices():
    torch.manual_seed(0)
    losses, _ = train(regressor(), fractions, mse_on_values, watched=False)
    assert end_over_variance(losses, fractions) > 0.5  # plain torch: as unexplained as the class indices

    torch.manual_seed(0)
    _, dbg = train(regressor(), fractions, mse_on_values, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert dbg._recorder.coverage.regression_target[0] == 0.0  # seen, and not integers


def test_a_noisy_binary_target_under_mse_is_not_class_indices():
    torch.manual_seed(0)
    losses, _ = train(regressor(), binary, mse_on_values, watched=False)
    assert end_over_variance(losses, binary) > 0.5  # plain torch: the noise keeps most of the variance

    torch.manual_seed(0)
    _, dbg = train(regressor(), binary, mse_on_values, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert dbg._recorder.coverage.regression_target[:3] == (1.0, 0.0, 1.0)


def test_profiling_the_target_leaves_the_training_bit_identical():
    torch.manual_seed(0)
    plain = regressor()
    plain_losses, _ = train(plain, classes, mse_on_values, watched=False)
    torch.manual_seed(0)
    watched = regressor()
    watched_losses, dbg = train(watched, classes, mse_on_values, watched=True)
    assert dbg is not None and dbg._recorder.coverage.regression_target  # the profiling path ran
    assert plain_losses == watched_losses
    for a, b in zip(plain.parameters(), watched.parameters()):
        assert torch.equal(a, b)


def logits_given_labels(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The labels handed to ``mse_loss`` beside a classifier's logits: ``(N, 1)`` broadcast to ``(N, C)``."""
    return F.mse_loss(out, y.float().unsqueeze(1))


def logits_given_one_hot(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """MSE on one-hot targets of the logits' own shape: a (Brier-like) classifier that works."""
    return F.mse_loss(out, F.one_hot(y, CLASSES).float())


def classifier() -> nn.Sequential:
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))


@pytest.mark.filterwarnings("ignore:Using a target size:UserWarning")
@pytest.mark.parametrize("make", [classes, counts], ids=["unordered classes", "an ordinal count"])
def test_labels_broadcast_across_a_classifiers_logits_are_found_however_well_the_loss_fits(make):
    torch.manual_seed(0)
    model = classifier()
    losses, _ = train(model, make, logits_given_labels, watched=False)
    broadcast_accuracy = held_out_accuracy(model, make)
    torch.manual_seed(0)
    twin = classifier()
    train(twin, make, F.cross_entropy, watched=False)
    classifier_accuracy = held_out_accuracy(twin, make)
    # plain torch: every logit is pulled to the label, so their argmax is near chance (1 in 10 classes) where the
    # cross-entropy twin classifies; on the count, every logit fits the label well (the loss explains most of its
    # variance: a test of the fit alone would stay silent), and the argmax is as poor
    assert broadcast_accuracy < 0.25 and classifier_accuracy > broadcast_accuracy + 0.3
    ratio = end_over_variance(losses, make)
    assert ratio < UNEXPLAINED if make is counts else ratio < 1.0, ratio

    torch.manual_seed(0)
    _, dbg = train(classifier(), make, logits_given_labels, watched=True)
    assert dbg is not None
    assert dbg.hypotheses() and dbg.hypotheses()[0].kind.value == KIND, dbg.explain_failure()
    m = found(dbg)[0].root.metrics
    assert (m["outputs"], m["low"], m["high"]) == (CLASSES, 0.0, CLASSES - 1.0)
    text = dbg.explain_failure()[0]
    assert "(N, 10)" in text and "'2'" in text, text  # the shapes, and the layer whose outputs they are
    assert "cross_entropy(outputs, labels)" in found(dbg)[0].suggestion


def held_out_accuracy(model: nn.Module, make: Callable[[int], support.Batch]) -> float:
    """The argmax's accuracy on held-out batches of ``make``."""
    model.eval()
    with torch.no_grad():
        held = [make(10_000 + i) for i in range(4)]
        return sum(float((model(x).argmax(1) == y).float().mean()) for x, y in held) / len(held)


def test_one_hot_targets_of_the_logits_own_shape_are_silent():
    torch.manual_seed(0)
    model = classifier()
    train(model, classes, logits_given_one_hot, watched=False)
    assert accuracy(model, lambda out: out.argmax(1)) > 0.5  # plain torch: MSE on one-hot targets classifies

    torch.manual_seed(0)
    _, dbg = train(classifier(), classes, logits_given_one_hot, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert dbg._recorder.coverage.repeated_target is None
