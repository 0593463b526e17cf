"""An activation between the logits and a loss that applies its own (a ReLU or a softmax before cross_entropy, a
sigmoid before binary_cross_entropy_with_logits), found from the loss's autograd graph. Ground truth is plain torch
in each test (the logits' gradient cut to exactly zero, a loss held above its floor, the twin that learns);
healthy twins that compute the same losses correctly stay silent, and the training is bit-identical."""

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
KIND = "activation_before_loss"


def classifier(relu_on_logits: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, CLASSES)]
    if relu_on_logits:
        layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def train(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    steps: int,
    watched: bool,
    make: Callable[[int], support.Batch] | None = None,
) -> tuple[list[float], NeuralDbg | None]:
    """A user's loop (no NeuralDBG call inside), Adam 1e-2."""
    make = make or support.classification_batches((32,), CLASSES, batch=64)
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


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_a_relu_on_the_logits_is_found_at_its_layer_and_the_cut_logits_get_exactly_zero_gradient():
    torch.manual_seed(0)
    model = classifier(relu_on_logits=True)
    # plain torch: every logit the ReLU cut gets exactly zero gradient (about half of them at initialisation)
    assert support.logits_cut_by_relu(model, support.classification_batches((32,), CLASSES, batch=64)(0)) > 0.3

    torch.manual_seed(0)
    _, dbg = train(classifier(relu_on_logits=True), F.cross_entropy, 20, watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND
    assert hits[0].root.layer == "3"  # the nn.ReLU whose output the loss takes
    assert hits[0].root.step_start == 0
    assert "ReLU" in hits[0].explanation and "raw logits" in hits[0].explanation

    torch.manual_seed(0)
    _, healthy = train(classifier(), F.cross_entropy, 20, watched=True)
    assert healthy is not None and not found(healthy), healthy.explain_failure()


def test_a_softmax_before_cross_entropy_holds_the_loss_above_its_floor_and_is_found_at_the_last_layer():
    def softmax_ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.softmax(dim=1), y)

    torch.manual_seed(0)
    losses, _ = train(classifier(), softmax_ce, 150, watched=False)
    torch.manual_seed(0)
    twin, _ = train(classifier(), F.cross_entropy, 150, watched=False)
    floor = math.log(math.e + CLASSES - 1) - 1  # a one-hot probability vector's cross-entropy, the least possible
    # plain torch: the loss on probabilities never goes below its floor; on the logits it goes far below it
    assert min(losses) >= floor - 1e-6
    assert sum(twin[-20:]) / 20 < 0.5 * floor

    torch.manual_seed(0)
    _, dbg = train(classifier(), softmax_ce, 20, watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.layer == "2"  # a functional softmax: the layer whose output it took
    assert "softmax" in hits[0].explanation and f"{floor:.3g}" in hits[0].explanation


@pytest.mark.parametrize(
    "loss_fn",
    [
        F.cross_entropy,
        lambda out, y: F.nll_loss(F.log_softmax(out, dim=1), y),
        lambda out, y: F.nll_loss(torch.log(out.softmax(dim=1) + 1e-9), y),  # probabilities, then their log
        lambda out, y: F.cross_entropy(F.relu(out) - out.detach().abs(), y),  # a ReLU not the loss's last input
    ],
    ids=["cross_entropy", "log_softmax_nll", "log_of_softmax_nll", "relu_below_another_op"],
)
def test_losses_given_raw_logits_or_their_own_log_probabilities_stay_silent(loss_fn):
    torch.manual_seed(0)
    _, dbg = train(classifier(), loss_fn, 12, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()


def test_a_relu_on_sequence_logits_reshaped_for_the_loss_is_found():
    """A language model's logits, cut by a ReLU, then viewed as (tokens, vocabulary) for cross_entropy: the views
    between the activation and the loss are looked through."""
    vocab = 40

    class TokenModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, 32)
            self.head = nn.Linear(32, vocab)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.relu(self.head(self.emb(x)))

    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.transpose(0, 1).contiguous().view(-1, vocab), y.view(16, 10).t().reshape(-1))

    torch.manual_seed(0)
    _, dbg = train(TokenModel(), loss_fn, 12, watched=True, make=support.token_batches(vocab))
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.layer == "head"


def test_a_sigmoid_before_a_loss_with_logits_is_found_and_a_sigmoid_before_plain_bce_is_not():
    make = support.classification_batches((32,), 2, batch=64)

    def binary(step: int) -> support.Batch:
        x, y = make(step)
        return x, y.float().unsqueeze(1)

    def model() -> nn.Sequential:
        return nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())

    def bce_logits(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(out, y)

    torch.manual_seed(0)
    probabilities = model()(binary(0)[0])
    # plain torch: what the loss takes as logits lies in (0, 1): no prediction it implies passes 0.73
    assert float(torch.sigmoid(probabilities.detach()).max()) < math.e / (1 + math.e) + 1e-6

    torch.manual_seed(0)
    _, dbg = train(model(), bce_logits, 12, watched=True, make=binary)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.layer == "3" and "binary_cross_entropy_with_logits" in hits[0].explanation

    torch.manual_seed(0)
    _, healthy = train(model(), F.binary_cross_entropy, 12, watched=True, make=binary)
    assert healthy is not None and not found(healthy), healthy.explain_failure()


def test_reading_the_loss_graph_changes_nothing_in_the_training():
    def run(watched: bool) -> tuple[list[float], nn.Module]:
        torch.manual_seed(0)
        model = classifier(relu_on_logits=True)
        losses, _ = train(model, F.cross_entropy, 10, watched=watched)
        return losses, model

    plain, plain_model = run(False)
    watched, watched_model = run(True)
    assert plain == watched
    for a, b in zip(plain_model.parameters(), watched_model.parameters()):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------------------------- softmax before BCELoss

TAGS = 6
_TAG_WEIGHTS = torch.randn(16, TAGS, generator=torch.Generator().manual_seed(3))


def tagged(n: int, seed: int, one_hot: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and their tags: several per row (a threshold on a linear map of the input), or the one largest."""
    x = torch.randn(n, 16, generator=torch.Generator().manual_seed(seed))
    scores = x @ _TAG_WEIGHTS
    if one_hot:
        return x, F.one_hot(scores.argmax(1), TAGS).float()
    return x, (scores > 0.5).float()


def train_tagger(activation: str, one_hot: bool, watched: bool) -> tuple[float, float, NeuralDbg | None]:
    """A multi-label MLP trained with binary_cross_entropy on its outputs after ``activation``; returns the targets'
    positive labels per row, the held-out F1 (each output over 0.5 is a tag) and the debugger."""
    torch.manual_seed(0)
    x, y = tagged(2048, 1, one_hot)
    held_x, held_y = tagged(512, 2, one_hot)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, TAGS))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    squash = (lambda o: F.softmax(o, dim=1)) if activation == "softmax" else torch.sigmoid

    def loop() -> None:
        for epoch in range(2):
            order = torch.randperm(2048, generator=torch.Generator().manual_seed(epoch))
            for i in range(0, 2048, 32):
                idx = order[i : i + 32]
                opt.zero_grad()
                F.binary_cross_entropy(squash(model(x[idx])), y[idx]).backward()
                opt.step()

    dbg = support.watching(model, loop, watched)
    with torch.no_grad():
        predicted = (squash(model(held_x)) > 0.5).float()
    f1 = float(2 * (predicted * held_y).sum() / (predicted.sum() + held_y.sum()))
    return float(y.sum(1).mean()), f1, dbg


def test_a_softmax_before_bce_on_multi_label_targets_is_found_and_its_sigmoid_and_one_hot_twins_are_not():
    # plain torch: the tags are several per row; with a softmax the tagger cannot reach them, with a sigmoid it can;
    # one-hot targets a softmax can reach
    positives, f1, _ = train_tagger("softmax", one_hot=False, watched=False)
    _, twin_f1, _ = train_tagger("sigmoid", one_hot=False, watched=False)
    one_hot_positives, one_hot_f1, _ = train_tagger("softmax", one_hot=True, watched=False)
    assert positives > 1.5 and one_hot_positives == 1.0
    assert f1 < twin_f1 - 0.3 and twin_f1 > 0.8 and one_hot_f1 > 0.6, (f1, twin_f1, one_hot_f1)

    _, _, dbg = train_tagger("softmax", one_hot=False, watched=True)
    assert dbg is not None
    hits = [h for h in dbg.hypotheses() if h.kind.value == KIND]
    assert hits, dbg.explain_failure()
    assert hits[0].root.layer == "2" and hits[0].root.detail == "softmax"
    assert math.isclose(hits[0].root.metrics["positives"], positives, rel_tol=0.25)
    assert "sigmoid" in hits[0].explanation and "BCEWithLogitsLoss" in hits[0].explanation

    for activation, one_hot in (("sigmoid", False), ("softmax", True)):
        _, _, twin = train_tagger(activation, one_hot=one_hot, watched=True)
        assert twin is not None
        assert not [h for h in twin.hypotheses() if h.kind.value == KIND], (activation, twin.explain_failure())
