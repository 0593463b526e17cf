"""Dropout far too strong where no dropout module holds it: ``F.dropout(h, 0.9)`` in ``forward`` (a graph network's
and a hand-written attention's habit) and an inverted dropout written by hand, read from the loss's autograd graph
on the first fully observed backward passes (``neuraldbg/capture/dropout_graph.py``). Ground truth is plain torch:
the same program at the usual rate reaches a clearly better held-out accuracy. Silent: its twins at 0.1 and 0.5, a
0/1 mask and a weighted padding mask multiplied in (factors with zeros that are no dropout), and an
``nn.Dropout(0.9)`` module, reported once (from the module), not again from its masks."""

from __future__ import annotations

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.capture import dropout_graph, loss_graph
from neuraldbg.capture.coverage import Coverage
from neuraldbg.config import HEAVY_DROPOUT
from neuraldbg.kinds.excessive_dropout import FORWARD_CODE, heavy_dropouts

KIND = "excessive_dropout"
CLASSES = 4
STEPS = 150
make = support.classification_batches((16,), CLASSES, batch=64, seed=4)


class FunctionalDropout(nn.Module):
    """An MLP whose dropout is ``F.dropout`` in ``forward``, as graph networks write it."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.a, self.b, self.head = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.dropout(F.relu(self.a(x)), self.p, training=self.training)
        h = F.dropout(F.relu(self.b(h)), self.p, training=self.training)
        return self.head(h)


class ByHand(FunctionalDropout):
    """The same with an inverted dropout written by hand: a Bernoulli mask of keep probability 1 - p, scaled, then
    multiplied in (``mask = (rand < keep) / keep; h = h * mask``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = 1.0 - self.p
        h = F.relu(self.a(x))
        mask = (torch.rand_like(h) < keep).float() / keep
        h = F.relu(self.b(h * mask))
        mask = (torch.rand_like(h) < keep).float() / keep
        return self.head(h * mask)


class Masked(FunctionalDropout):
    """No dropout; its hidden units multiplied by a fixed 0/1 mask (a pruning mask), or by a weight of 10 on the kept
    ones (a weighted mask): factors with zeros whose share says no dropout."""

    def __init__(self, p: float, weight: float = 1.0) -> None:
        super().__init__(p)
        keep = torch.ones(64)
        keep[::4] = 0.0  # a quarter pruned
        self.register_buffer("mask", keep * weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.a(x)) * self.mask
        h = F.relu(self.b(h / self.mask.amax())) * self.mask
        return self.head(h / self.mask.amax())


def held_out_accuracy(model: nn.Module) -> float:
    model.eval()
    with torch.no_grad():
        held = [make(10_000 + i) for i in range(4)]
        return sum(float((model(x).argmax(1) == y).float().mean()) for x, y in held) / len(held)


def run(build, p: float, watched: bool, **kw: float) -> tuple[list[float], float, NeuralDbg | None]:
    torch.manual_seed(0)
    model = build(p, **kw)
    dbg: NeuralDbg | None = None
    if watched:
        dbg, losses = support.train(model, make, F.cross_entropy, steps=STEPS)
    else:
        losses = support.plain_train(model, make, F.cross_entropy, steps=STEPS)
    return losses, held_out_accuracy(model), dbg


def kinds(dbg: NeuralDbg | None) -> list[str]:
    assert dbg is not None
    return [h.kind.value for h in dbg.hypotheses()]


@pytest.mark.parametrize("build", [FunctionalDropout, ByHand], ids=["F.dropout", "by hand"])
def test_dropout_of_nine_tenths_in_the_forward_code_is_found_and_its_twins_are_silent(build):
    losses, accuracy, _ = run(build, 0.9, watched=False)
    _, usual, _ = run(build, 0.5, watched=False)
    assert accuracy < usual - 0.1  # plain torch: at 0.9 the held-out accuracy is far below the usual setting's

    watched, _, dbg = run(build, 0.9, watched=True)
    assert watched == losses  # the debugger changes nothing
    assert kinds(dbg)[:1] == [KIND], dbg and dbg.explain_failure()
    found = dbg.hypotheses()[0]
    assert found.root.metrics["p"] == pytest.approx(0.9, abs=1e-6) and found.root.metrics["layers"] == 1
    assert FORWARD_CODE in found.explanation and "lower the dropout probability" in found.suggestion

    for p in (0.1, 0.5):
        _, _, twin = run(build, p, watched=True)
        assert twin is not None and KIND not in kinds(twin), twin.explain_failure()


@pytest.mark.parametrize("weight", [1.0, 10.0])
def test_masks_multiplied_in_that_are_no_dropout_are_silent(weight):
    _, _, dbg = run(Masked, 0.0, watched=True, weight=weight)
    assert dbg is not None and KIND not in kinds(dbg), dbg.explain_failure()
    assert dbg._recorder.coverage.graph_dropout == 0.0


def test_a_heavy_dropout_module_is_reported_once():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.9), nn.Linear(64, CLASSES))
    dbg, _ = support.train(model, make, F.cross_entropy, steps=STEPS)
    assert kinds(dbg)[:1] == [KIND]
    assert dbg._recorder.coverage.graph_dropout == pytest.approx(0.9, abs=1e-6)  # its masks are in the graph too
    found = dbg.hypotheses()[0]
    assert found.root.metrics["layers"] == 1 and FORWARD_CODE not in found.explanation


def test_the_rate_of_each_form_is_read_from_a_graph():
    x = torch.randn(32, 64, requires_grad=True)
    for p in (0.1, 0.5, 0.9):
        known, masked = dropout_graph.heaviest(loss_graph.hold([F.dropout(x, p, training=True).sum()]))
        assert known is None and masked is not None and float(masked) == pytest.approx(p, abs=1e-6)
        out, _ = torch.native_dropout(x, p, True)  # the GPU kernel's node saves its rate
        known, masked = dropout_graph.heaviest(loss_graph.hold([out.sum()]))
        assert known == pytest.approx(p) and masked is None
    # at the limit: 1 - 1 / 5 read in float32 counts as a dropout of 0.8, as a module's p=0.8 does
    coverage = Coverage()
    coverage.graph_dropout = float(
        dropout_graph.heaviest(loss_graph.hold([F.dropout(x, HEAVY_DROPOUT, training=True).sum()]))[1]
    )
    assert [name for name, _ in heavy_dropouts(coverage)] == [FORWARD_CODE]
    coverage.graph_dropout = HEAVY_DROPOUT - 5e-4  # a float32 reading just below it (another device's rounding)
    assert [name for name, _ in heavy_dropouts(coverage)] == [FORWARD_CODE]
    coverage.graph_dropout = 0.79  # below it: none
    assert heavy_dropouts(coverage) == []
    # a product of two learned factors, a mask of ones, a constant weight everywhere: no dropout
    for other in (torch.randn(32, 64, requires_grad=True), torch.ones(32, 64), torch.full((32, 64), 10.0)):
        _, masked = dropout_graph.heaviest(loss_graph.hold([(x * other).sum()]))
        assert masked is None or float(masked) == 0.0
    # a mask of 0 or 10 whose share of zeros is a quarter, not nine tenths: a weighted mask, no dropout
    weighted = torch.full((32, 64), 10.0)
    weighted[:, ::4] = 0.0
    _, masked = dropout_graph.heaviest(loss_graph.hold([(x * weighted).sum()]))
    assert masked is not None and float(masked) == 0.0
    # nine tenths zeros and a largest value of 10, but many values between: a sparse weighting, no mask
    g = torch.Generator().manual_seed(0)
    sparse = torch.where(torch.rand(32, 64, generator=g) < 0.1, 1 + 9 * torch.rand(32, 64, generator=g), 0.0)
    sparse[0, 0] = 10.0
    _, masked = dropout_graph.heaviest(loss_graph.hold([(x * sparse).sum()]))
    assert masked is not None and float(masked) == 0.0
    # a learned factor shaped like a mask (a gate the model learns) is no dropout
    gate = torch.where(torch.rand(32, 64, generator=g) < 0.1, 10.0, 0.0).requires_grad_()
    _, masked = dropout_graph.heaviest(loss_graph.hold([(x * gate).sum()]))
    assert masked is None
    _, masked = dropout_graph.heaviest(
        loss_graph.hold([(x * gate.detach()).sum()])
    )  # the same values, not learned: a mask
    assert masked is not None and float(masked) == pytest.approx(0.9, abs=1e-6)
