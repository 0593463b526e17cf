"""An explosion present on the first step, before any update, is the initial forward pass's doing, not the learning
rate's. A residual MLP whose 8 blocks add their skip twice (``out = x + f(x); out = out + x``) doubles its signal
block after block: its first loss is thousands of times the targets' mean square and it never fits, while the same
net with one skip per block does. The verdict names the growth along the forward order and a fix about the forward
pass, not "lower the learning rate". Its twins keep their words: the one-skip net at a learning rate far too high
explodes after a few steps (lower the learning rate), and one layer with weights far too large is re-initialised.
Ground truth is plain torch in each test."""

from __future__ import annotations

import copy
import itertools

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind

BLOCKS = 8


def data(n: int, seed: int) -> support.Batch:
    """A smooth function of 10 standard-normal inputs (targets of variance about 1.3)."""
    w = torch.randn(10, 3, generator=torch.Generator().manual_seed(4321))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    h = x @ w / 10**0.5
    y = (torch.sin(2 * h[:, 0]) + h[:, 1] ** 2 - h[:, 2]).unsqueeze(1)
    return x, y + 0.05 * torch.randn(n, 1, generator=g)


class Block(nn.Module):
    def __init__(self, twice: bool) -> None:
        super().__init__()
        self.fc1, self.fc2, self.twice = nn.Linear(64, 64), nn.Linear(64, 64), twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x + self.fc2(F.relu(self.fc1(x)))
        return out + x if self.twice else out  # the fault: the skip added a second time


class ResMLP(nn.Module):
    def __init__(self, twice: bool) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(10, 64), nn.Linear(64, 1)
        self.blocks = nn.Sequential(*[Block(twice) for _ in range(BLOCKS)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x)))


TRAIN = data(1024, 1)


def batches(step: int) -> support.Batch:
    i = (step * 64) % 1024
    return TRAIN[0][i : i + 64], TRAIN[1][i : i + 64]


def model(twice: bool) -> ResMLP:
    torch.manual_seed(0)
    return ResMLP(twice)


def held_out_r2(net: nn.Module, steps: int, lr: float = 1e-3) -> float:
    """Plain torch: trained under Adam, the held-out R^2 (1 - error / the targets' variance)."""
    support.plain_train(net, batches, steps=steps, optimizer=torch.optim.Adam(net.parameters(), lr=lr))
    x, y = data(1024, 999)
    with torch.no_grad():
        return 1 - F.mse_loss(net(x), y).item() / y.var().item()


def block_rms(net: ResMLP, x: torch.Tensor) -> list[float]:
    """Plain torch: the rms of each block's output, in order."""
    outputs = support.capture_outputs(net, x, [f"blocks.{i}" for i in range(BLOCKS)])
    return [outputs[f"blocks.{i}"].pow(2).mean().sqrt().item() for i in range(BLOCKS)]


def test_a_skip_added_twice_blows_up_the_forward_pass_and_is_not_blamed_on_the_learning_rate():
    x, y = batches(0)
    # plain torch: at initialisation each block doubles the signal, and the first loss is far off the targets' scale
    rms = block_rms(model(twice=True), x)
    assert all(1.8 < b / a < 2.3 for a, b in itertools.pairwise(rms)), rms
    with torch.no_grad():
        first = F.mse_loss(model(twice=True)(x), y).item()
    assert first > 100 * y.pow(2).mean().item() and first > 300 * y.var().item()
    once = block_rms(model(twice=False), x)
    assert once[-1] < 3 * once[0]  # one skip per block: no such growth
    assert held_out_r2(model(twice=True), steps=160) < 0.3 < 0.9 < held_out_r2(model(twice=False), steps=160)

    dbg, _ = support.train(model(twice=True), batches, steps=24)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.EXPLODING_GRADIENTS and top.root.step_start == 0
    assert "before any update: no learning rate caused it" in top.explanation, top.explanation
    assert "The layers' outputs grow" in top.explanation and "'blocks.0." in top.explanation
    assert "'blocks.7." in top.explanation and "the targets' mean square" in top.explanation
    assert top.suggestion.startswith("fix the scale of the forward pass at initialisation between 'blocks.0.")
    assert "residual (skip) connections" in top.suggestion and "lower the learning rate (now" not in top.suggestion

    healthy, _ = support.train(model(twice=False), batches, steps=24)
    assert not healthy.hypotheses(), healthy.report()


def test_the_same_net_exploding_after_a_few_steps_at_a_learning_rate_far_too_high_is_told_to_lower_it():
    x, y = batches(0)
    net = model(twice=False)
    # plain torch: calm gradients at initialisation, a loss that blows up after the first large steps
    calm = copy.deepcopy(net)
    support.one_backward(calm, (x, y))
    assert max(support.layer_gradients(calm).values()) < 100
    twin = copy.deepcopy(net)
    losses = support.plain_train(twin, batches, steps=12, optimizer=_sgd(twin))
    assert losses[0] < 10 and not max(losses) < 1e6  # (NaN counts as blown up)

    dbg, _ = support.train(net, batches, steps=12, optimizer=_sgd(net))

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.EXPLODING_GRADIENTS and top.root.step_start > 0, dbg.report()
    assert top.suggestion.startswith("lower the learning rate (now 0.2)"), top.suggestion
    assert "no learning rate caused it" not in top.explanation


def test_one_layer_with_weights_far_too_large_is_still_re_initialised():
    torch.manual_seed(0)
    net = support.mlp(width=64, depth=4)
    with torch.no_grad():
        net[2].weight.mul_(1e4)
    support.one_backward(net, support.regression_batches()(0))
    assert max(support.grad_norms(net).values()) > 1e3  # plain torch: exploding at initialisation

    sgd = torch.optim.SGD(net.parameters(), lr=1e-6)
    dbg, _ = support.train(net, support.regression_batches(), steps=20, optimizer=sgd)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.EXPLODING_GRADIENTS and top.root.layer == "2"
    assert top.suggestion.startswith("re-initialise '2'"), top.suggestion


def _sgd(net: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(net.parameters(), lr=0.2)
