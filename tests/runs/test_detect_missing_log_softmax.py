"""``nll_loss`` given values that are not log-probabilities (the raw logits: log_softmax forgotten), found from the
loss's autograd graph and the log-sum-exp of the values it saved. Ground truth is plain torch in each test (the loss
runs below zero without bound, the classifier ends far worse than its twin); twins that hand nll_loss true
log-probabilities, however computed, stay silent, and the training is bit-identical."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.kinds import missing_log_softmax
from neuraldbg.stats.tensors import log_prob_gap

CLASSES = 10
KIND = "missing_log_softmax"
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def classifier() -> nn.Sequential:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def train(model: nn.Module, loss_fn: LossFn, steps: int, watched: bool) -> tuple[list[float], NeuralDbg | None]:
    """A user's loop (no NeuralDBG call inside), Adam 1e-2."""
    make = support.classification_batches((32,), CLASSES, batch=64)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
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


def accuracy(model: nn.Module) -> float:
    x, y = support.classification_batches((32,), CLASSES, batch=1024)(10_000)  # held out: a step never trained on
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_nll_loss_on_raw_logits_runs_below_zero_learns_worse_than_its_twin_and_is_found_at_the_last_layer():
    torch.manual_seed(0)
    model = classifier()
    losses, _ = train(model, F.nll_loss, 200, watched=False)
    torch.manual_seed(0)
    twin = classifier()
    twin_losses, _ = train(twin, lambda out, y: F.nll_loss(F.log_softmax(out, dim=1), y), 200, watched=False)
    # plain torch: on raw logits the loss leaves the range of any cross-entropy and falls without bound, and the
    # classes are not learned against each other; the twin learns them
    assert losses[-1] < -10 and min(twin_losses) > 0
    assert accuracy(model) < accuracy(twin) - 0.2

    torch.manual_seed(0)
    watched_losses, dbg = train(classifier(), F.nll_loss, 200, watched=True)
    assert watched_losses == losses  # the debugger changed nothing
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND
    root = hits[0].root
    assert root.layer == "2"  # the head whose output nll_loss took
    assert root.step_start == 0
    assert root.metrics["gap"] > math.log(2)
    assert "log_softmax" in hits[0].explanation and "cross_entropy" in hits[0].explanation
    assert "below zero" in hits[0].explanation


@pytest.mark.parametrize(
    "loss_fn",
    [
        F.cross_entropy,
        lambda out, y: F.nll_loss(F.log_softmax(out, dim=1), y),
        lambda out, y: F.nll_loss(torch.log(out.softmax(dim=1) + 1e-9), y),  # probabilities, then their log
        lambda out, y: F.nll_loss(out - out.logsumexp(dim=1, keepdim=True), y),  # log-softmax written out
        lambda out, y: F.nll_loss(F.log_softmax(out / 2.0, dim=1).double().float(), y),  # tempered, then a copy
    ],
    ids=["cross_entropy", "log_softmax", "log_of_softmax", "minus_logsumexp", "tempered_copy"],
)
def test_nll_loss_on_true_log_probabilities_is_silent_and_training_unchanged(loss_fn: LossFn):
    torch.manual_seed(0)
    plain, _ = train(classifier(), loss_fn, 80, watched=False)
    torch.manual_seed(0)
    losses, dbg = train(classifier(), loss_fn, 80, watched=True)
    assert losses == plain
    assert min(losses) > 0  # plain torch: a cross-entropy of log-probabilities never goes below zero
    assert dbg is not None and not found(dbg), dbg.explain_failure()


def test_a_log_softmax_over_the_batch_learns_worse_than_its_twin_and_is_found_naming_the_dimension():
    """``F.nll_loss(F.log_softmax(out, dim=0), y)``: a log_softmax, over the batch instead of the classes (hunt 20).
    It produced the input, so the check used to trust it."""

    def across(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(F.log_softmax(out, dim=0), y)

    torch.manual_seed(0)
    model = classifier()
    losses, _ = train(model, across, 200, watched=False)
    torch.manual_seed(0)
    twin = classifier()
    train(twin, lambda out, y: F.nll_loss(F.log_softmax(out, dim=1), y), 200, watched=False)
    # plain torch: the rows are not log-probabilities over the classes, and the classifier learns worse
    x, _ = support.classification_batches((32,), CLASSES, batch=64)(0)
    rows = F.log_softmax(model(x), dim=0).logsumexp(dim=1)
    assert float(rows.abs().max()) > 1.0
    assert accuracy(model) < accuracy(twin) - 0.03  # 0.82 against 0.87 here; a CNN of hunt 20 fell to 0.28

    torch.manual_seed(0)
    watched_losses, dbg = train(classifier(), across, 200, watched=True)
    assert watched_losses == losses
    assert dbg is not None
    hits = found(dbg)
    assert hits and dbg.hypotheses()[0].kind.value == KIND, dbg.explain_failure()
    assert hits[0].root.metrics["dim"] == 0
    text = hits[0].explanation
    assert "over dimension 0" in text and "dim=1" in text and "missing log-softmax" not in text.lower()


def test_the_log_of_a_softmax_over_the_batch_is_found_naming_the_dimension_not_a_loss_without_bound():
    """``nll_loss(torch.log(softmax(out, dim=0)), y)``: log-probabilities over the batch, never above 0, so the loss
    cannot run below zero as on raw logits; the text says what is wrong instead."""
    torch.manual_seed(0)
    losses, dbg = train(classifier(), lambda out, y: F.nll_loss(torch.log(F.softmax(out, dim=0)), y), 80, True)
    assert min(losses) > 0  # plain torch: the values are logs of probabilities
    assert dbg is not None
    hits = found(dbg)
    assert hits and hits[0].root.metrics["dim"] == 0, dbg.explain_failure()
    assert "over dimension 0" in hits[0].explanation and "below zero" not in hits[0].explanation


@pytest.mark.parametrize("dim", [1, -1])
def test_a_log_softmax_over_the_classes_by_any_name_or_through_a_transpose_is_silent(dim: int):
    def through_transpose(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # (C, N) normalised over C
        return F.nll_loss(F.log_softmax(out.t(), dim=0).t(), y)

    for loss_fn in (lambda out, y: F.nll_loss(F.log_softmax(out, dim=dim), y), through_transpose):
        torch.manual_seed(0)
        _, dbg = train(classifier(), loss_fn, 40, watched=True)
        assert dbg is not None and not found(dbg), dbg.explain_failure()


def test_a_segmentation_nll_loss_over_pixels_is_judged_on_its_class_dimension():
    """NLLLoss over (N, C, H, W): the log-sum-exp is over dimension 1, the classes, for every pixel."""
    torch.manual_seed(0)
    x = torch.randn(8, 3, 6, 6)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()

    def run(log_softmax: bool) -> NeuralDbg:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with NeuralDbg(model) as dbg:
            for _ in range(6):
                out = model(x)
                loss = F.nll_loss(F.log_softmax(out, dim=1) if log_softmax else out, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        return dbg

    assert found(run(log_softmax=False))
    healthy = run(log_softmax=True)
    assert not found(healthy), healthy.explain_failure()


def test_the_gap_is_zero_for_log_probabilities_and_leaves_out_fully_masked_rows():
    logits = torch.randn(5, 7) * 4
    assert float(log_prob_gap(F.log_softmax(logits, dim=1))) < 1e-5
    assert float(log_prob_gap(logits)) > missing_log_softmax.GAP
    masked = F.log_softmax(logits.masked_fill(torch.arange(7) > 2, float("-inf")), dim=1)
    masked[0] = float("-inf")  # every class of one row masked: its log-sum-exp is -inf, not a gap
    assert float(log_prob_gap(masked)) < 1e-5
    assert float(log_prob_gap(F.log_softmax(torch.randn(7), dim=0))) < 1e-5  # one unbatched vector
    assert float(log_prob_gap(F.log_softmax(torch.randn(2, 3, 4, 4), dim=1))) < 1e-5  # classes on dimension 1
    assert float(log_prob_gap(torch.empty(0, 7))) == 0.0  # no rows: an nll_loss over an empty selection
    assert float(log_prob_gap(torch.empty(0))) == 0.0
    half = F.log_softmax(logits, dim=1).half()
    assert float(log_prob_gap(half)) < missing_log_softmax.GAP / 10  # float16 rounding stays far below the limit


def test_nll_loss_over_an_empty_selection_keeps_the_observation_whole():
    """A training split that selects no sample: nll_loss over an empty tensor is NaN (plain torch). Its input has
    no rows to read: the observation goes on and the NaN is what is reported, not a broken recording."""
    model = classifier()
    x, y = support.classification_batches((32,), CLASSES, batch=64)(0)
    none = torch.zeros(64, dtype=torch.bool)
    assert torch.isnan(F.nll_loss(model(x)[none], y[none]))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with NeuralDbg(model) as dbg:
        for _ in range(4):
            opt.zero_grad()
            F.nll_loss(model(x)[none], y[none]).backward()
            opt.step()
    kinds = {h.kind.value for h in dbg.hypotheses()}
    assert "incomplete_observation" not in kinds, dbg.explain_failure()
    assert not found(dbg)


# --- ctc_loss: log-probabilities over the last dimension of a (T, N, C) input ------------------------------------

SYMBOLS, FRAMES, LABEL = 5, 16, 4  # classes 1..5 and the blank 0; 16 frames per sequence, 4 labels


class Recognizer(nn.Module):
    def __init__(self, normalise: bool) -> None:
        super().__init__()
        self.normalise = normalise
        self.rnn = nn.GRU(SYMBOLS + 1, 32)
        self.out = nn.Linear(32, SYMBOLS + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.out(self.rnn(x)[0])  # (T, N, C)
        return F.log_softmax(scores, dim=-1) if self.normalise else scores


def utterances(step: int, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Each label held for 4 noisy frames, one-hot: a greedy reading of the frames recovers the labels."""
    g = torch.Generator().manual_seed(step)
    labels = torch.randint(1, SYMBOLS + 1, (n, LABEL), generator=g)
    frames = labels.repeat_interleave(FRAMES // LABEL, dim=1).T  # (T, N)
    x = F.one_hot(frames, SYMBOLS + 1).float() + 0.5 * torch.randn(FRAMES, n, SYMBOLS + 1, generator=g)
    return x, labels


def ctc_train(normalise: bool, watched: bool) -> tuple[list[float], Recognizer, NeuralDbg | None]:
    torch.manual_seed(0)
    model = Recognizer(normalise)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    lengths, label_lengths = torch.full((16,), FRAMES), torch.full((16,), LABEL)

    def ctc(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.ctc_loss(scores, labels, lengths, label_lengths)

    losses, dbg = support.fit(model, utterances, ctc, 150, opt, watched)
    return losses, model, dbg


def frame_accuracy(model: Recognizer) -> float:
    """Held-out: the frames' most likely class against the label the frame holds."""
    x, y = utterances(10_000, 256)
    with torch.no_grad():
        best = model(x).argmax(-1)  # (T, N)
    return float((best == y.repeat_interleave(FRAMES // LABEL, dim=1).T).float().mean())


def test_ctc_loss_on_raw_scores_runs_below_zero_and_is_found_as_a_missing_log_softmax():
    losses, model, _ = ctc_train(normalise=False, watched=False)
    twin_losses, twin, _ = ctc_train(normalise=True, watched=False)
    # plain torch: a CTC loss of log-probabilities is never negative; on raw scores it runs below zero, and the
    # frames are read worse than the twin reads them
    assert min(losses) < 0 <= min(twin_losses)
    assert frame_accuracy(model) < frame_accuracy(twin) - 0.1
    watched_losses, _, dbg = ctc_train(normalise=False, watched=True)
    assert watched_losses == losses
    assert dbg is not None
    hits = found(dbg)
    assert hits and dbg.hypotheses()[0].kind.value == KIND, dbg.explain_failure()
    assert hits[0].root.layer == "out" and hits[0].root.step_start == 0
    assert "ctc_loss (CTCLoss)" in hits[0].explanation and "dim=-1" in hits[0].suggestion


def test_ctc_loss_on_log_probabilities_is_silent():
    _, _, dbg = ctc_train(normalise=True, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
