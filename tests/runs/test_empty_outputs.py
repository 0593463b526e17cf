"""Layer outputs without elements are normal and say nothing: a mixture of experts whose router sends no token to an
expert on a step (the expert still runs, on an empty batch), an empty batch. Before, a fully observed step's
per-unit statistics reduced over the empty batch dimension, failed, and stopped the observation at the first such
step: the verdict of a healthy run was "observation incomplete". The ground truth (that experts do get empty
batches, that the run learns) is checked with plain torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.support import watching


class Experts(nn.Module):
    """Top-1 routing over four small experts on a shared hidden state (a switch layer), then a 3-class head."""

    def __init__(self, d: int = 16, n: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(8, d)
        self.gate = nn.Linear(d, n)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, d)) for _ in range(n))
        self.head = nn.Linear(d, 3)

    def routes(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = F.relu(self.embed(x))
        weights = self.gate(h).softmax(1)
        return h, weights, weights.argmax(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, weights, pick = self.routes(x)
        out = h
        for e, expert in enumerate(self.experts):
            idx = (pick == e).nonzero().squeeze(1)  # often empty: the expert runs on no token
            out = out.index_add(0, idx, weights[idx, e : e + 1] * expert(h[idx]))
        return self.head(out)


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(8, 3, generator=g)
    xs = [torch.randn(6, 8, generator=g) for _ in range(32)]
    return [(x, (x @ teacher).argmax(1)) for x in xs]


def _train_experts(watched: bool) -> tuple[list[float], int, object]:
    torch.manual_seed(0)
    model = Experts()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = _batches()
    losses: list[float] = []
    idle = 0

    def loop() -> None:
        nonlocal idle
        for i in range(120):
            x, y = data[i % len(data)]
            with torch.no_grad():
                idle += 4 - len(set(model.routes(x)[2].tolist()))  # experts that get no token this step
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())

    dbg = watching(model, loop, watched)
    return losses, idle, dbg


def test_a_mixture_of_experts_whose_experts_sit_out_steps_is_observed_to_the_end_and_healthy():
    plain, idle, _ = _train_experts(watched=False)
    assert idle > 100  # plain torch: experts run on empty batches on many steps, the first fully observed ones too
    assert sum(plain[-20:]) < 0.5 * sum(plain[:20])  # ... and the model learns
    losses, _, dbg = _train_experts(watched=True)
    assert losses == plain  # the debugger changes nothing
    assert dbg is not None and dbg.steps == 120
    assert not dbg.explain_failure(), dbg.report()


def test_an_empty_batch_on_a_fully_observed_step_leaves_the_run_observed_and_healthy():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(4, 3, generator=g)
    sizes = [0 if i == 3 else 16 for i in range(60)]  # step 3: fully observed (the first 16 are)
    batches = [torch.randn(n, 4, generator=g) for n in sizes]
    losses: list[float] = []

    def loop() -> None:
        for x in batches:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), (x @ teacher).argmax(1), reduction="sum") / 16
            loss.backward()
            opt.step()
            losses.append(loss.item())

    dbg = watching(model, loop, watched=True)
    assert losses[3] == 0.0  # the empty batch: no loss, no gradient
    assert sum(losses[-10:]) / 10 < 0.75 * sum(losses[:3]) / 3  # the run learns
    assert dbg is not None and dbg.steps == 60
    assert not dbg.explain_failure(), dbg.report()
