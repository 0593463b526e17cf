"""``binary_cross_entropy`` given raw scores clamped into [0, 1] (the sigmoid forgotten, the error BCELoss raises on
values outside [0, 1] silenced with a clamp), found from the loss's autograd graph and the share of the clamp's input
outside [0, 1]. Ground truth is plain torch in each test (the clamp passes no gradient to the scores it cuts, the
multi-label classifier ends far worse than its twin over seeds); twins that hand BCELoss probabilities, however
computed and clamped, stay silent, and the training is bit-identical."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.kinds import missing_sigmoid
from neuraldbg.stats.tensors import outside_unit

KIND = "missing_sigmoid"
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
LABELS = 8


def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A multi-label task: 8 labels, each a noisy threshold of a linear function of 20 features."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 20, generator=g)
    w = torch.randn(20, LABELS, generator=g)
    y = ((x @ w) / 4 + 0.3 * torch.randn(3000, LABELS, generator=g) > 0.3).float()
    return x[:2400], y[:2400], x[2400:], y[2400:]


def tagger() -> nn.Sequential:
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, LABELS))


def train(
    seed: int, probabilities: Callable[[torch.Tensor], torch.Tensor], epochs: int, watched: bool
) -> tuple[list[float], float, float, NeuralDbg | None]:
    """A user's loop (no NeuralDBG call inside): Adam 1e-3, batches of 64, BCELoss on ``probabilities(scores)``.
    Returns the losses, the held-out accuracy (a label predicted when its probability is above one half), the share
    of the scores that got exactly no gradient (plain torch, unwatched runs only) and the debugger."""
    x, y, x_test, y_test = data()
    torch.manual_seed(seed)
    model = tagger()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []
    cut: list[float] = []

    def loop() -> None:
        for _ in range(epochs):
            order = torch.randperm(len(x))
            for i in range(0, len(x), 64):
                batch = order[i : i + 64]
                opt.zero_grad()
                scores = model(x[batch])
                if not watched:
                    scores.retain_grad()
                loss = nn.BCELoss()(probabilities(scores), y[batch])
                loss.backward()
                if not watched:
                    assert scores.grad is not None
                    cut.append(float((scores.grad == 0).float().mean()))
                opt.step()
                losses.append(float(loss.detach()))

    dbg = support.watching(model, loop, watched)
    with torch.no_grad():
        accuracy = float(((probabilities(model(x_test)) > 0.5).float() == y_test).float().mean())
    return losses, accuracy, sum(cut) / max(len(cut), 1), dbg


def clamped(scores: torch.Tensor) -> torch.Tensor:
    return scores.clamp(1e-4, 1 - 1e-4)


def found(dbg: NeuralDbg | None) -> list:
    assert dbg is not None
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_bce_on_clamped_raw_scores_cuts_their_gradient_learns_worse_than_its_twin_and_is_found_at_the_head():
    # plain torch over three seeds: the clamp passes no gradient to the scores it cuts, and the classifier ends
    # well below its twin given probabilities
    for seed in range(3):
        _, accuracy, cut, _ = train(seed, clamped, 6, watched=False)
        _, twin, twin_cut, _ = train(seed, torch.sigmoid, 6, watched=False)
        assert cut > 0.03 and twin_cut == 0.0
        assert accuracy < twin - 0.05

    plain, _, _, _ = train(0, clamped, 2, watched=False)
    losses, _, _, dbg = train(0, clamped, 2, watched=True)
    assert losses == plain  # the debugger changed nothing
    hits = found(dbg)
    assert hits and dbg is not None, dbg.explain_failure() if dbg else ""
    assert dbg.hypotheses()[0].kind.value == KIND
    root = hits[0].root
    assert root.layer == "2"  # the head whose scores were clamped
    assert root.step_start == 0
    assert root.metrics["outside"] > 0.3  # a fresh head's raw scores: about half lie below 0
    assert "sigmoid" in hits[0].explanation and "BCEWithLogitsLoss" in hits[0].explanation


def test_a_hard_clip_of_the_scores_to_zero_and_one_is_the_same_fault():
    _, _, _, dbg = train(0, lambda s: torch.clamp(s, 0, 1), 1, watched=True)
    assert found(dbg), dbg.explain_failure() if dbg else ""


@pytest.mark.parametrize(
    "probabilities",
    [
        torch.sigmoid,
        lambda s: torch.sigmoid(s).clamp(1e-6, 1 - 1e-6),  # clamped away from 0 and 1 for the log
        lambda s: torch.sigmoid(s).clamp(min=1e-6),
        lambda s: ((torch.tanh(s) + 1) / 2).clamp(1e-6, 1 - 1e-6),  # probabilities made another way
        lambda s: F.softmax(torch.stack((s, -s), dim=-1), dim=-1)[..., 0].clamp(1e-6, 1 - 1e-6),  # a softmax column
    ],
    ids=["sigmoid", "sigmoid_clamped", "sigmoid_clamp_min", "tanh_rescaled", "softmax_column"],
)
def test_bce_on_probabilities_clamped_or_not_is_silent_and_training_unchanged(probabilities):
    plain, _, _, _ = train(0, probabilities, 1, watched=False)
    losses, _, _, dbg = train(0, probabilities, 1, watched=True)
    assert losses == plain
    assert not found(dbg), dbg.explain_failure() if dbg else ""


def test_bce_with_logits_on_the_raw_scores_is_silent():
    torch.manual_seed(0)
    model = tagger()
    x, y, _, _ = data()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model) as dbg:
        for i in range(0, 640, 64):
            opt.zero_grad()
            F.binary_cross_entropy_with_logits(model(x[i : i + 64]), y[i : i + 64]).backward()
            opt.step()
    assert not found(dbg), dbg.explain_failure()


def test_the_share_outside_the_unit_interval_counts_finite_values_only():
    assert float(outside_unit(torch.tensor([0.0, 0.5, 1.0]))) == 0.0  # the bounds are probabilities
    assert float(outside_unit(torch.tensor([-0.1, 0.5, 1.2, 0.3]))) == 0.5
    assert float(outside_unit(torch.tensor([float("nan"), -1.0]))) == 1.0  # a NaN is the non-finite room's
    assert float(outside_unit(torch.empty(0))) == 0.0
    assert float(outside_unit(torch.sigmoid(torch.randn(1000) * 20))) == 0.0
    assert float(outside_unit(torch.randn(1000))) > 10 * missing_sigmoid.OUTSIDE
