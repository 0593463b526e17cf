"""Gradients so large that their float32 norm overflows, though every element is finite: a RealNVP flow whose
coupling networks are initialised with N(0, 3) weights sends gradients of ~1e33 back. Plain torch: every gradient
element finite; Adam's second moment (the gradient squared) overflows to inf, so every update is 0 and the weights
never move. The diagnosis is the explosion, rooted where it starts, with the stall as its consequence: not a
non-finite gradient (none is), not a learning rate to raise."""

from __future__ import annotations

import math

import torch
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.kinds import exploding_gradients

STEPS = 60


class Coupling(nn.Module):
    def __init__(self, flip: bool, scale: float | None) -> None:
        super().__init__()
        self.flip = flip
        self.net = nn.Sequential(nn.Linear(1, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
        if scale is not None:
            for p in self.net.parameters():
                nn.init.normal_(p, 0.0, scale)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = (x[:, 1:], x[:, :1]) if self.flip else (x[:, :1], x[:, 1:])
        st = self.net(a)
        log_scale = torch.tanh(st[:, :1])
        b = b * log_scale.exp() + st[:, 1:]
        return (torch.cat([b, a], 1) if self.flip else torch.cat([a, b], 1)), log_scale.sum(1)


class Flow(nn.Module):
    def __init__(self, scale: float | None) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Coupling(i % 2 == 1, scale) for i in range(6)])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_det = torch.zeros(x.shape[0])
        for layer in self.layers:
            x, d = layer(x)
            log_det = log_det + d
        return x, log_det


def moons(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    t = torch.rand(128, generator=g) * math.pi
    upper = torch.rand(128, generator=g) < 0.5
    x = torch.where(upper, t.cos(), 1 - t.cos())
    y = torch.where(upper, t.sin(), 0.5 - t.sin())
    return torch.stack([x, y], 1) + 0.05 * torch.randn(128, 2, generator=g)


def nll(flow: Flow, x: torch.Tensor) -> torch.Tensor:
    z, log_det = flow(x)
    return -(-0.5 * (z**2).sum(1) - math.log(2 * math.pi) + log_det).mean()


def train(scale: float | None, watched: bool) -> tuple[Flow, torch.optim.Adam, list[float], NeuralDbg | None]:
    torch.manual_seed(0)
    flow = Flow(scale)
    opt = torch.optim.Adam(flow.parameters(), lr=2e-3)
    losses: list[float] = []
    grads: list[float] = []

    def loop() -> None:
        for step in range(STEPS):
            opt.zero_grad()
            loss = nll(flow, moons(step))
            loss.backward()
            if step == 0:
                grads.extend(float(p.grad.abs().max()) for p in flow.parameters())
            opt.step()
            losses.append(float(loss.detach()))

    if watched:
        with NeuralDbg(flow) as dbg:
            loop()
    else:
        loop()
    return flow, opt, [*losses, max(grads)], dbg if watched else None


def moved(flow: Flow, start: list[torch.Tensor]) -> float:
    """||W - W_start|| / ||W_start|| over all parameters."""
    delta = sum(float(((p.detach() - s) ** 2).sum()) for p, s in zip(flow.parameters(), start))
    return math.sqrt(delta / sum(float((s**2).sum()) for s in start))


def test_gradients_whose_norm_overflows_float32_are_an_explosion_that_stalls_adam_not_non_finite():
    torch.manual_seed(0)
    start = [p.detach().clone() for p in Flow(3.0).parameters()]
    flow, opt, out, _ = train(3.0, watched=False)
    losses, largest = out[:-1], out[-1]
    # plain torch: every gradient element finite yet beyond what float32 can square; Adam's second moment overflowed
    # and those weights never moved
    assert math.isfinite(largest) and largest > exploding_gradients.SQUARE_OVERFLOW
    assert all(math.isfinite(v) for v in losses)
    assert any(torch.isinf(opt.state[p]["exp_avg_sq"]).any() for p in flow.parameters())
    assert moved(flow, start) < 0.01  # the weights hardly moved (the twin initialised as torch does: 0.05 and more)

    _, _, watched_out, dbg = train(3.0, watched=True)
    assert watched_out == out  # the debugger changed nothing
    assert dbg is not None
    kinds = [h.kind.value for h in dbg.hypotheses()]
    assert kinds == ["exploding_gradients"], dbg.explain_failure()  # one fault: the stall is its consequence
    assert "non_finite" not in {e.kind.value for e in dbg.get_root_causes() if e.kind is not None}
    top = dbg.hypotheses()[0]
    assert "stalled updates" in top.explanation and "re-initialise" in top.suggestion
    assert top.explanation.count("stalled updates in the model") == 1


def test_the_same_flow_initialised_as_torch_does_is_silent():
    torch.manual_seed(0)
    start = [p.detach().clone() for p in Flow(None).parameters()]
    flow, _, out, dbg = train(None, watched=True)
    losses = out[:-1]
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10  # plain torch: it learns
    assert moved(flow, start) > 0.05
    assert dbg is not None and dbg.hypotheses() == [], dbg.explain_failure()
