"""TorchScript modules (``torch.jit.script``, a whole model or a submodule) are observed. Before, the first fully
observed forward pass read a layer's own weight with ``module._parameters.get``, which a scripted module's table
does not have, and observation stopped at step 0: a healthy scripted model ended "observation incomplete". A
scripted layer's class is ``RecursiveScriptModule``, so its role (a ReLU, a Linear) is not known: a fault in one
is still found at its layer, under a less specific kind. Ground truth in plain torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.support import watching

# deprecated since torch 2.9 in favour of torch.compile and torch.export, and still in code bases
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


class _Scripted(nn.Module):
    """A scripted first block (Linear and ReLU) and a plain head."""

    def __init__(self, block: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.block = torch.jit.script(block)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))


def _model(whole: bool, dead: bool) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    if dead:
        with torch.no_grad():
            net[0].bias.fill_(-20.0)  # every unit of the ReLU negative on every input
    return torch.jit.script(net) if whole else _Scripted(nn.Sequential(net[0], net[1]), net[2])


def _train(model: nn.Module, watched: bool) -> tuple[list[float], object]:
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(4, 3, generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []

    def loop() -> None:
        for _ in range(60):
            x = torch.randn(16, 4, generator=g)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), (x @ teacher).argmax(1))
            loss.backward()
            opt.step()
            losses.append(loss.item())

    return losses, watching(model, loop, watched)


def test_healthy_scripted_models_are_observed_to_the_end_and_silent():
    for whole in (True, False):
        plain, _ = _train(_model(whole, dead=False), watched=False)
        assert sum(plain[-10:]) < 0.8 * sum(plain[:10])  # plain torch: it learns
        losses, dbg = _train(_model(whole, dead=False), watched=True)
        assert losses == plain
        assert dbg is not None and dbg.steps == 60
        assert not dbg.explain_failure(), dbg.report()


def test_a_dead_layer_inside_a_scripted_model_is_found_at_that_layer():
    for whole in (True, False):
        model = _model(whole, dead=True)
        first = model[0] if whole else model.block[0]
        x = torch.randn(32, 4)
        assert not (F.relu(F.linear(x, first.weight, first.bias)) > 0).any()  # plain torch: the ReLU is dead
        _, dbg = _train(model, watched=True)
        assert dbg is not None and dbg.steps == 60
        found = dbg.explain_failure()
        assert found and not any("incomplete" in f for f in found), found
        assert ("'0'" if whole else "'block.0'") in found[0]
