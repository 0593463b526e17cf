"""Residual branches gated at zero by design (SkipInit: each branch times a scalar that starts at 0) under a linear
warm-up barely move for their first steps: their gradients scale with gates that grow from nothing at a learning
rate a thousandth of its peak. The median layer is such a branch, so the update ratio reads a stall, and then the
model trains as its ungated twin does: a stall that passed before the fit is no fault. A learning rate too low for
the whole run still is. Ground truth by plain torch: held-out accuracy and the per-step median update ratio."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 300


class Block(nn.Module):
    def __init__(self, width: int, gate: float) -> None:
        super().__init__()
        self.branch = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
        self.alpha = nn.Parameter(torch.tensor(gate))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.alpha * self.branch(x)


def net(gate: float) -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), *[Block(64, gate) for _ in range(6)], nn.ReLU(), nn.Linear(64, 4))


def data(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 16, generator=g)
    return x, (x[:, :4] * x[:, 4:8]).argmax(1)


def train(gate: float, peak: float, paused: range = range(0)) -> tuple[NeuralDbg, float, list[float]]:
    """(debugger, held-out accuracy, median update/weight ratio over the weight matrices per step); ``paused``: the
    steps a schedule sets the learning rate to 0 on."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = data(4096, g)
    model = net(gate)
    opt = torch.optim.SGD(model.parameters(), lr=peak, momentum=0.9)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: 0.0 if it in paused else min(1.0, 1e-3 + it / 100))
    weights = [p for p in model.parameters() if p.dim() == 2]
    ratios = []
    with NeuralDbg(model) as dbg:
        for _ in range(STEPS):
            i = torch.randint(0, len(x), (64,), generator=g)
            opt.zero_grad()
            F.cross_entropy(model(x[i]), y[i]).backward()
            before = [w.detach().clone() for w in weights]
            opt.step()
            warmup.step()
            moved = sorted(float((w.detach() - b).norm() / b.norm()) for w, b in zip(weights, before))
            ratios.append(moved[len(moved) // 2])
    test_x, test_y = data(2048, torch.Generator().manual_seed(2))
    with torch.no_grad():
        accuracy = float((model(test_x).argmax(1) == test_y).float().mean())
    return dbg, accuracy, ratios


@pytest.mark.parametrize("gate", [0.0, 1.0])
def test_branches_gated_at_zero_that_stall_under_a_warmup_then_train_are_silent(gate):
    dbg, accuracy, ratios = train(gate, peak=0.05)
    _, ungated, _ = train(1.0, peak=0.05) if gate == 0.0 else (None, accuracy, None)
    # plain torch: gated at zero, the median layer moves by less than 1e-5 of its size for the first steps, then
    # the model learns as well as the ungated twin (chance is about 0.25)
    if gate == 0.0:
        assert max(ratios[1:6]) < 1e-5
    assert accuracy > 0.6 and abs(accuracy - ungated) < 0.1
    assert not {h.kind for h in dbg.hypotheses()} & {FailureKind.STALLED_UPDATES}, dbg.explain_failure()
    assert dbg.healthy, dbg.explain_failure()


def test_the_same_net_at_a_learning_rate_too_low_for_the_whole_run_is_a_stall():
    dbg, accuracy, ratios = train(0.0, peak=5e-6)
    assert max(ratios) < 1e-5 and accuracy < 0.4  # plain torch: nothing moves, nothing is learned
    assert FailureKind.STALLED_UPDATES in {h.kind for h in dbg.hypotheses()}, dbg.report()


def test_a_schedule_at_zero_for_a_stretch_is_a_stall_even_when_the_run_recovers():
    """No parameter changing at all is a fact, not a reading: the stall is reported though the loss fell after it."""
    dbg, accuracy, ratios = train(1.0, peak=0.05, paused=range(150, 210))
    assert max(ratios[151:210]) == 0.0 and accuracy > 0.6  # plain torch: nothing moved there; the run recovered
    stalls = [h for h in dbg.hypotheses() if h.kind is FailureKind.STALLED_UPDATES]
    assert stalls and 145 <= stalls[0].root.step_start <= 155, dbg.report()


def test_a_layer_clipping_held_still_for_a_stretch_is_reported_even_when_the_run_recovers():
    """Clipping that holds a layer still is a fact, not a reading: reported though the loss fell after it. An MLP
    under Adam whose middle layer's gradient is clipped to a norm of 1e-9 over a fifth of the run (below Adam's
    epsilon: that layer does not move), then released."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = data(4096, g)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    moved = []
    with NeuralDbg(model) as dbg:
        for step in range(600):
            i = torch.randint(0, len(x), (64,), generator=g)
            opt.zero_grad()
            F.cross_entropy(model(x[i]), y[i]).backward()
            if 180 <= step < 300:
                torch.nn.utils.clip_grad_norm_(model[2].parameters(), 1e-9)
            before = model[2].weight.detach().clone()
            opt.step()
            moved.append(float((model[2].weight.detach() - before).norm() / before.norm()))
    test_x, test_y = data(2048, torch.Generator().manual_seed(2))
    with torch.no_grad():
        accuracy = float((model(test_x).argmax(1) == test_y).float().mean())
    # plain torch: the layer barely moves while clipped (Adam's momentum aside, its first steps), the run recovers
    assert max(moved[260:300]) < 1e-5 < min(moved[310:320]) and accuracy > 0.6
    held = [h for h in dbg.hypotheses() if h.kind is FailureKind.STALLED_UPDATES and h.root.layer == "2"]
    assert held and "clipping" in held[0].explanation, dbg.report()
