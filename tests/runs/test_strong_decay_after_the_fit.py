"""Strong weight decay on purpose after the training set is fitted (grokking): the decay makes up most of each
step and the weights shrink because the loss's gradient has all but vanished, not because the decay holds a fit
back. Ground truth is plain torch in the test: the training loss falls to ~0, held-out accuracy is high only
because of the decay (the twin with the usual 0.01 stays at chance), so "lower weight_decay" would be wrong."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

P = 23


class ModularAddition(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(P, 64)
        self.mlp = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, P))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.embed(a), self.embed(b)], 1))


def grok(weight_decay: float, watched: bool) -> tuple[float, float, NeuralDbg | None]:
    torch.manual_seed(0)
    a, b = (t.flatten() for t in torch.meshgrid(torch.arange(P), torch.arange(P), indexing="ij"))
    y = (a + b) % P
    order = torch.randperm(P * P, generator=torch.Generator().manual_seed(1234))
    train, held = order[: int(0.6 * P * P)], order[int(0.6 * P * P) :]
    model = ModularAddition()
    opt = torch.optim.AdamW(model.parameters(), 3e-3, weight_decay=weight_decay, betas=(0.9, 0.98))
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.attach()
    try:
        for _ in range(5000):
            loss = F.cross_entropy(model(a[train], b[train]), y[train])
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        if dbg is not None:
            dbg.close()
    with torch.no_grad():
        accuracy = float((model(a[held], b[held]).argmax(1) == y[held]).float().mean())
    return float(loss.detach()), accuracy, dbg


def test_grokking_under_weight_decay_one_is_not_called_excessive_decay():
    loss, accuracy, dbg = grok(1.0, watched=True)
    _, usual, _ = grok(0.01, watched=False)
    assert loss < 1e-4 and accuracy > 0.8  # plain torch (the watched run is bit-identical): fitted, and generalises
    assert usual < 0.1  # ... only because of the decay
    assert dbg is not None
    assert not [h for h in dbg.hypotheses() if h.kind.value == "excessive_weight_decay"], dbg.explain_failure()
