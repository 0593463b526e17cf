"""A multi-class hinge classifier (``multi_margin_loss``) whose loss falls to exactly 0 because it learned the task:
every margin of a batch met, so the loss and its gradient are exactly zero on most steps from then on, with a hard
batch giving a gradient now and then. That is convergence, not a degenerate loss. Its twin takes the same hinge over
a mask that is empty on most batches from the first ones (the samples of one class only, in batches of four):
nothing to learn from on those steps, found. Ground truth is plain torch in each test."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

CLASSES = 10


def sample(centers: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples of ten well-separated class centres in 32 dimensions."""
    y = torch.randint(0, CLASSES, (n,))
    return centers[y] + 0.7 * torch.randn(n, 32), y


def accuracy(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> float:
    with torch.no_grad():
        return float((model(data[0]).argmax(1) == data[1]).float().mean())


def train(batch: int, only_class: int | None = None) -> tuple[NeuralDbg, list[float], list[bool], float, float]:
    """300 steps of SGD on the hinge loss; ``only_class``: the loss masked to that class's samples."""
    torch.manual_seed(42)
    centers = 1.5 * torch.randn(CLASSES, 32)
    held_out = sample(centers, 2000)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    before = accuracy(model, held_out)
    torch.manual_seed(1)
    losses, zero = [], []
    with NeuralDbg(model) as dbg:
        for _ in range(300):
            x, y = sample(centers, batch)
            each = F.multi_margin_loss(model(x), y, reduction="none")
            loss = each.mean() if only_class is None else (each * (y == only_class)).mean()
            opt.zero_grad()
            loss.backward()
            zero.append(all(float(p.grad.abs().max()) == 0.0 for p in model.parameters()))
            opt.step()
            losses.append(loss.item())
    return dbg, losses, zero, before, accuracy(model, held_out)


def test_a_hinge_classifier_whose_margins_are_all_met_has_converged():
    dbg, losses, zero, before, after = train(batch=64)
    # plain torch: the loss falls from its start to near 0 with a gradient on every step, then is exactly zero on
    # most steps (every margin of the batch met) with fewer than one step in twenty still giving a gradient; the
    # classifier went from chance to right on every held-out sample
    first = zero.index(True)
    assert first >= 8 and not any(zero[:first])
    assert losses[0] > 0.9 and min(losses[:first]) < 0.01 * losses[0]
    assert sum(zero) > 250
    assert 0 < sum(not z for z in zero[first:]) < 0.05 * len(zero[first:])
    assert before < 0.2 and after == 1.0
    assert not dbg.hypotheses(), dbg.report()


def test_a_hinge_over_a_mask_empty_on_most_batches_from_the_start_is_degenerate():
    dbg, _, zero, _, _ = train(batch=4, only_class=0)
    # plain torch: most batches of four hold no sample of class 0, so their loss and every gradient are exactly zero,
    # from the first steps on
    assert any(zero[:8]) and sum(zero) > 0.5 * len(zero)
    assert FailureKind.DEGENERATE_LOSS in {h.kind for h in dbg.hypotheses()}, dbg.report()
