"""A super-resolution net at 100x its learning rate: the explosion that killed its ReLUs is the hypothesis, and the
dead units and the vanishing gradients it caused are in its chain, never ranked above it.

The program: the sub-pixel CNN of pytorch/examples (conv 5x5, 3x3, 3x3, 3x3 to 4 channels, PixelShuffle(2), one
shared ReLU, orthogonal init) on 0-255 pixels with MSE and Adam, at lr 1.0 against its twin at 1e-2. Ground truth
by plain torch: the largest layer gradient norm per step, the outputs of conv1 never positive after the ReLU, and
conv1's gradient exactly zero once they are.
"""

from __future__ import annotations

import statistics

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.real.data import images
from neuraldbg import FailureKind, NeuralDbg


class SubPixel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 32, 5, 1, 2)
        self.conv2 = nn.Conv2d(32, 32, 3, 1, 1)
        self.conv3 = nn.Conv2d(32, 16, 3, 1, 1)
        self.conv4 = nn.Conv2d(16, 4, 3, 1, 1)
        self.shuffle = nn.PixelShuffle(2)
        for conv in (self.conv1, self.conv2, self.conv3):
            nn.init.orthogonal_(conv.weight, nn.init.calculate_gain("relu"))
        nn.init.orthogonal_(self.conv4.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        return self.shuffle(self.conv4(x))


STEPS = 40


def train(lr: float) -> tuple[NeuralDbg, list[float], list[float], list[float], list[float]]:
    """(debugger, losses, largest layer gradient norm, share of conv1's channels never positive after the ReLU,
    conv1's gradient norm) per step."""
    torch.manual_seed(0)
    pixels, _ = images(STEPS * 16, noise=0.1)
    high = pixels.float()  # 0-255, input and target
    low = F.avg_pool2d(high, 2)
    model = SubPixel()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses: list[float] = []
    top: list[float] = []
    dead: list[float] = []
    first: list[float] = []

    def never_positive(module: nn.Module, args: object, out: torch.Tensor) -> None:
        dead.append(float(((out > 0).sum(dim=(0, 2, 3)) == 0).float().mean()))

    hook = model.conv1.register_forward_hook(never_positive)  # conv1 > 0 exactly where its ReLU is positive
    with NeuralDbg(model) as dbg:
        for step in range(STEPS):
            x, target = low[step * 16 : (step + 1) * 16], high[step * 16 : (step + 1) * 16]
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), target)
            loss.backward()
            norms = {n: float(m.weight.grad.norm()) for n, m in model.named_children() if hasattr(m, "weight")}
            top.append(max(norms.values()))
            first.append(norms["conv1"])
            optimizer.step()
            losses.append(loss.item())
    hook.remove()
    return dbg, losses, top, dead, first


@pytest.fixture(scope="module")
def far_too_high() -> tuple[NeuralDbg, list[float], list[float], list[float], list[float]]:
    return train(1.0)


def test_the_explosion_is_the_hypothesis_and_the_dead_units_and_vanishing_gradients_its_victims(far_too_high):
    dbg, losses, top, dead, first = far_too_high
    # plain torch: gradients a million times their first step's right after it (MSE on 0-255 pixels makes them
    # large from the start: 1.8e4), then every channel of conv1 never positive and conv1's gradient exactly zero
    # for the rest of the run; the loss ends above where it started
    blowup = next(step for step, g in enumerate(top) if g > 1e6 * top[0])
    assert blowup == 1
    assert min(dead[blowup + 3 :]) == 1.0 and max(first[blowup + 3 :]) == 0.0
    assert statistics.fmean(losses[-10:]) > losses[0]

    hypotheses = dbg.hypotheses()
    top_hypothesis = hypotheses[0]
    assert top_hypothesis.kind is FailureKind.EXPLODING_GRADIENTS
    assert top_hypothesis.root.step_start <= blowup + 1
    kinds_in_chain = {e.kind for e in top_hypothesis.chain}
    assert {FailureKind.DEAD_NEURONS, FailureKind.VANISHING_GRADIENTS} <= kinds_in_chain
    assert "learning rate is too high" in top_hypothesis.explanation
    assert top_hypothesis.suggestion.startswith("lower the learning rate (now 1)")
    # nothing the explosion caused stands as a hypothesis of its own ahead of it
    assert all(h.kind not in (FailureKind.DEAD_NEURONS, FailureKind.VANISHING_GRADIENTS) for h in hypotheses)


def test_the_same_net_at_its_own_learning_rate_is_silent():
    dbg, losses, top, dead, _ = train(1e-2)
    assert statistics.fmean(losses[-10:]) < 0.3 * losses[0] and max(top) < 100 * top[0] and max(dead) < 0.5
    assert dbg.hypotheses() == []
