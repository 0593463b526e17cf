"""A learning rate far too high is named as the fault, not the units it killed.

The program: an MNIST-style MLP (256-128-64-10, ReLU, ``nn.Sequential``) on digit-like template images, Adam,
cross-entropy, a shuffling DataLoader, three epochs: written as users write it. At lr 0.1 (100x the twin's 1e-3)
the first Adam step rewrites the weights (||dW||/||W|| ~2), the loss jumps tenfold and falls back within a few steps,
and units of the second ReLU die over the run. Ground truth by plain torch: the losses, the median update/weight
ratio per step (parameter copies around ``optimizer.step()``) and the units of the second ReLU positive on no
sample (a forward hook of our own), against the same program at lr 1e-3.
"""

from __future__ import annotations

import statistics

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.real.data import images
from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.reasoning.rules import SURGE_LOOKBACK, is_update_surge


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    pixels, labels = images(3072)  # the first 2048 for training (the rest would be held out)
    return (pixels[:2048].float() / 255.0 - 0.27) / 0.30, labels[:2048]


def train(lr: float, seed: int, watch: bool) -> tuple[NeuralDbg | None, list[float], list[float], list[float]]:
    """(debugger, losses, median update/weight ratio per step, dead fraction of the second ReLU per step)."""
    torch.manual_seed(seed)
    x, y = digits()
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(256, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    weights = [p for p in model.parameters() if p.dim() == 2]
    losses: list[float] = []
    ratios: list[float] = []
    dead: list[float] = []

    def never_positive(module: nn.Module, args: object, out: torch.Tensor) -> None:
        dead.append(float(((out > 0).sum(dim=0) == 0).float().mean()))

    hook = model[5].register_forward_hook(never_positive)
    dbg = NeuralDbg(model) if watch else None
    with dbg if dbg is not None else torch.enable_grad():
        for _epoch in range(3):
            for xb, yb in loader:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                before = [w.detach().clone() for w in weights]
                optimizer.step()
                ratios.append(
                    statistics.median(float((w.detach() - b).norm() / b.norm()) for w, b in zip(weights, before))
                )
                losses.append(loss.item())
    hook.remove()
    return dbg, losses, ratios, dead


@pytest.fixture(scope="module")
def twin() -> tuple[NeuralDbg | None, list[float], list[float], list[float]]:
    return train(1e-3, 0, watch=True)


@pytest.mark.parametrize("seed", [0, 1])
def test_units_dying_long_after_the_first_oversized_updates_are_the_learning_rates_doing(seed, twin):
    dbg, losses, ratios, dead = train(0.1, seed, watch=True)
    _, plain, _, _ = train(0.1, seed, watch=False)
    _, healthy, healthy_ratios, healthy_dead = twin

    # plain torch: the debugger changed nothing; the first steps rewrite the weights (healthy: under 5 %, 2 % at
    # its first step), the loss jumps tenfold and falls back, units of the second ReLU die over the run (none in
    # the twin) and the fit ends far worse than the twin's
    assert losses == plain
    assert ratios[0] > 1.0 and min(ratios[:4]) > 0.1 and max(healthy_ratios) < 0.05
    assert losses[1] > 5 * losses[0] and min(losses[2:8]) < 2 * losses[0]
    assert statistics.fmean(dead[-24:]) > 0.5 and max(healthy_dead[-24:]) < 0.1
    assert statistics.fmean(losses[-16:]) > 3 * statistics.fmean(healthy[-16:])

    assert dbg is not None
    (surge,) = [e for e in dbg.events if is_update_surge(e)]
    assert surge.step_start == 0
    (death,) = [e for e in dbg.events if e.kind is FailureKind.DEAD_NEURONS]
    assert death.layer == "5" and death.step_start > surge.step_end + SURGE_LOOKBACK  # long after, not set off

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.OVERSIZED_UPDATES and top.root is surge
    assert death in top.chain
    assert "dead units in '5'" in top.explanation and "learning rate 0.1" in top.explanation
    assert top.suggestion.startswith("lower the learning rate (now 0.1)")
    assert FailureKind.DEAD_NEURONS not in {h.kind for h in dbg.hypotheses()}


def test_the_same_program_at_its_own_learning_rate_is_silent(twin):
    dbg, losses, _, _ = twin
    assert statistics.fmean(losses[-16:]) < 0.3 * losses[0]  # plain torch: it learns
    assert dbg is not None and dbg.hypotheses() == []


# --- the loss it spoilt ---------------------------------------------------------------------------------------


def softmax_regression(lr: float) -> tuple[NeuralDbg, list[float], list[float]]:
    """A linear classifier (64 features, 10 classes) under Adam for 64 steps: (debugger, losses, the weight's
    ||dW||/||W|| per step), by plain torch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 10))
    teacher = torch.randn(64, 10, generator=torch.Generator().manual_seed(2001))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses: list[float] = []
    ratios: list[float] = []
    with NeuralDbg(model) as dbg:
        for step in range(64):
            x = torch.randn(64, 64, generator=torch.Generator().manual_seed(100_003 + step))
            y = (x @ teacher).argmax(dim=1)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            before = model[0].weight.detach().clone()
            optimizer.step()
            ratios.append(float((model[0].weight.detach() - before).norm() / before.norm()))
            losses.append(loss.item())
    return dbg, losses, ratios


def test_a_loss_that_climbs_from_the_first_oversized_updates_is_the_learning_rates_finding():
    dbg, losses, ratios = softmax_regression(1.0)
    twin, twin_losses, twin_ratios = softmax_regression(1e-2)
    # plain torch: the first steps move the weight by more than a fifth of its norm (the twin: a tenth at its second
    # step, less from then on), the loss climbs from 2.5 to above 5 and ends far above the twin's, which learns
    assert min(ratios[:5]) > 0.2 and max(twin_ratios[2:]) < 0.1
    assert statistics.fmean(losses[4:12]) > 2 * losses[0]
    assert statistics.fmean(losses[-16:]) > 2 * statistics.fmean(twin_losses[-16:])
    assert statistics.fmean(twin_losses[-16:]) < 0.5 * twin_losses[0]

    (h,) = dbg.hypotheses()
    assert h.kind is FailureKind.OVERSIZED_UPDATES and h.root.step_start == 0
    loss_findings = [e for e in h.chain if e.kind in (FailureKind.UNSTABLE_LOSS, FailureKind.LOSS_NOT_DECREASING)]
    assert loss_findings and "learning rate 1" in h.explanation
    assert h.suggestion.startswith("lower the learning rate (now 1)")
    assert twin.hypotheses() == []
