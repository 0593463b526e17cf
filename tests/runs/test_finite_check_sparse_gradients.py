"""The cheap steps' finite check of many small float32 gradients sums them as one flat copy, checking only their
types first: a sparse gradient among them (an ``nn.Embedding(sparse=True)``, whose gradient torch keeps sparse) makes
that copy raise, and the check goes the long way instead. Either way a NaN is dated at its step, and a healthy run is
silent. Ground truth by plain torch: ``torch.isfinite`` on every gradient before the optimizer's step."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.events import EventType
from neuraldbg.stats import tensors as stats

STEPS = 40
SPECIAL = 25  # a cheap step of the default schedule


class Bag(nn.Module):
    """A bag-of-words classifier: a sparse-gradient embedding (or a dense one), then eight small Linear layers."""

    def __init__(self, sparse: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.EmbeddingBag(50, 8, mode="mean", sparse=sparse)
        self.body = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(8, 8), nn.ReLU())])
        self.head = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.emb(ids)))


def train(sparse: bool, poison: bool) -> tuple[NeuralDbg, list[int], Bag]:
    """SGD (which takes sparse gradients); at ``SPECIAL`` one gradient value of a small Linear layer is set to NaN
    when ``poison`` (the parameters are put back after that step's update)."""
    net = Bag(sparse)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    bad: list[int] = []
    with NeuralDbg(net) as dbg:
        for step in range(STEPS):
            g = torch.Generator().manual_seed(step)
            ids = torch.randint(0, 50, (16, 6), generator=g)
            y = ids[:, 0] % 3
            opt.zero_grad()
            F.cross_entropy(net(ids), y).backward()
            if step == SPECIAL and poison:
                net.body[4].weight.grad[0, 0] = math.nan
            grads = [p.grad for p in net.parameters() if p.grad is not None]
            if any(not bool(torch.isfinite(g.to_dense() if g.is_sparse else g).all()) for g in grads):
                bad.append(step)
            kept = [p.detach().clone() for p in net.parameters()] if step == SPECIAL else []
            opt.step()
            with torch.no_grad():
                for p, k in zip(net.parameters(), kept):
                    p.copy_(k)
    return dbg, bad, net


def non_finite_gradients(dbg: NeuralDbg) -> set[tuple[int, str]]:
    return {
        (e.step_start, e.layer)
        for e in dbg.events
        if e.kind is FailureKind.NON_FINITE and e.event_type is EventType.GRADIENT
    }


def test_the_flat_sum_is_what_the_check_takes_and_a_sparse_gradient_makes_it_raise():
    net = Bag(sparse=True)
    F.cross_entropy(net(torch.randint(0, 50, (4, 6))), torch.zeros(4, dtype=torch.long)).backward()
    grads = [p.grad for p in net.parameters()]
    dense = [g for g in grads if not g.is_sparse]
    assert stats.flat_check_pays([p for p in net.parameters()])  # the list is summed flat
    assert stats.plain_types(grads) and any(g.is_sparse for g in grads)
    assert stats.surely_finite(dense, flat=True)
    try:
        stats.surely_finite(grads, flat=True)
    except RuntimeError:
        pass
    else:  # pragma: no cover - the long way is then never taken, and this test would not test it
        raise AssertionError("a sparse gradient in the flat copy did not raise")


def test_a_nan_among_sparse_and_dense_gradients_is_dated_at_its_step():
    for sparse in (True, False):
        dbg, bad, _ = train(sparse, poison=True)
        assert bad == [SPECIAL]  # plain torch: only the poisoned step held a non-finite gradient
        assert (SPECIAL, "body.4") in non_finite_gradients(dbg), (sparse, non_finite_gradients(dbg))


def test_a_healthy_run_with_sparse_gradients_is_silent():
    dbg, bad, _ = train(sparse=True, poison=False)
    assert not bad
    assert not non_finite_gradients(dbg) and not any(h.kind is FailureKind.NON_FINITE for h in dbg.hypotheses()), (
        dbg.report()
    )
