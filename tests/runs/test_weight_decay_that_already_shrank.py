"""A weight decay that already won: Adam's coupled weight_decay=1 on a GRU classifier shrinks the weights' norm a
hundredfold in the run's first half, while the loss stays at chance. By the second half the decay has little left to
take, its share of each step is small there, and it is judged over the first half, where it did the shrinking.

Ground truth by plain torch in the test: the decay's share of each step (weight_decay x ||W|| against the loss's own
gradient) over both halves, the weights' norm, the loss, and the held-out accuracy against a twin under a decay of
1e-2, which learns the task and stays silent."""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.kinds import excessive_weight_decay

STEPS = 160


def data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of 12 steps of 4 features; the class is the largest sum of the first three features."""
    x = torch.randn(n, 12, 4, generator=torch.Generator().manual_seed(seed))
    return x, x[:, :, :3].sum(1).argmax(1)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(4, 32, batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


def norm(tensors: list[torch.Tensor]) -> float:
    return float(torch.sqrt(sum((t.detach() ** 2).sum() for t in tensors)))


def train(weight_decay: float) -> tuple[NeuralDbg, list[float], list[float], list[float], float]:
    """Adam at 3e-3 with coupled ``weight_decay``; the debugger, the losses, the decay's share of each step and the
    weights' norm (plain torch, read beside the optimizer), and the held-out accuracy."""
    torch.manual_seed(0)
    (x, y), (x_held, y_held) = data(2048, 1), data(1000, 2)
    model = Classifier()
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=3e-3, weight_decay=weight_decay)
    pick = torch.Generator().manual_seed(1)
    losses, shares, norms = [], [], []
    with NeuralDbg(model) as dbg:
        for _ in range(STEPS):
            idx = torch.randint(0, 2048, (32,), generator=pick)
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            norms.append(norm(params))
            shares.append(weight_decay * norms[-1] / norm([p.grad for p in params]))
            opt.step()
            losses.append(float(loss.detach()))
    with torch.no_grad():
        accuracy = float((model(x_held).argmax(1) == y_held).float().mean())
    return dbg, losses, shares, norms, accuracy


def test_a_decay_that_shrank_the_weights_a_hundredfold_is_named_though_its_late_share_is_small() -> None:
    dbg, losses, shares, norms, accuracy = train(1.0)
    *_, twin_accuracy = train(1e-2)
    # plain torch: the decay dominated the steps of the first half and shrank the weights a hundredfold; over the
    # second half its share is below the rule's limit; the loss stayed at chance (ln 3) and the model learned nothing
    half = STEPS // 2
    assert statistics.median(shares[:half]) > 10 * excessive_weight_decay.SHARE
    assert statistics.median(shares[half:]) < excessive_weight_decay.SHARE
    assert norms[-1] < norms[0] / 100
    assert statistics.fmean(losses[-20:]) > 1.0 and accuracy < 0.4 < 0.9 < twin_accuracy

    found = next(h for h in dbg.hypotheses() if h.kind is FailureKind.EXCESSIVE_WEIGHT_DECAY)
    assert dbg.hypotheses()[0] is found
    m = found.root.metrics
    assert m["decay"] == 1.0 and m["early"] == 1.0 and m["share"] >= excessive_weight_decay.SHARE
    assert m["weight_end"] <= excessive_weight_decay.SHRUNK * m["weight_start"]
    assert "while the weights shrank" in found.explanation and "lower weight_decay (now 1)" in found.explanation


def test_the_twin_under_a_decay_of_one_hundredth_learns_and_stays_silent() -> None:
    dbg, _, shares, norms, accuracy = train(1e-2)
    # plain torch: the decay's share was sizable early on (large weights, a small gradient) but the weights kept
    # their size and the model learned the task
    assert max(shares) > 0.1 and norms[-1] > 0.5 * norms[0] and accuracy > 0.9
    assert FailureKind.EXCESSIVE_WEIGHT_DECAY not in {h.kind for h in dbg.hypotheses()}
