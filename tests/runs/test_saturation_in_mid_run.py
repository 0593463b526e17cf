"""Saturation that begins in mid-run is the learning rate's doing, not the initialisation's: its fix lowers the
learning rate and never names the init (a tiny BERT at lr 5 under the HF Trainer was told to rescale the pooler's
init, though the same init trains well at 5e-4).

The program: a tanh MLP classifier (64-32-10) under Adam. Ground truth by plain torch: the share of the tanh's
outputs where its derivative is below 1 % of its maximum (|tanh| > 0.995), per step, at lr 0.5 and 0.1 against the
twin at 1e-3 (which never saturates and learns).
"""

from __future__ import annotations

import statistics

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 64


def train(lr: float) -> tuple[NeuralDbg, list[float], list[float]]:
    """(debugger, losses, saturated share of the tanh's outputs per step)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
    batches = support.classification_batches((64,), 10, batch=64)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses: list[float] = []
    saturated: list[float] = []
    hook = model[1].register_forward_hook(
        lambda m, i, out: saturated.append(float((out.detach().abs() > 0.995).float().mean()))
    )
    with NeuralDbg(model) as dbg:
        for step in range(STEPS):
            x, y = batches(step)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    hook.remove()
    return dbg, losses, saturated


@pytest.mark.parametrize("lr", [0.5, 0.1])
def test_saturation_that_began_in_mid_run_is_fixed_by_the_learning_rate_not_the_init(lr):
    dbg, _, saturated = train(lr)
    # plain torch: not saturated at the first step, most of the tanh's outputs saturated by the end
    assert saturated[0] < 0.05 and statistics.fmean(saturated[-16:]) > 0.5

    (h,) = [h for h in dbg.hypotheses() if h.kind is FailureKind.SATURATED_ACTIVATIONS]
    assert h.root.layer == "1" and h.root.step_start > 0
    assert h.suggestion.startswith(f"lower the learning rate (now {lr:g})")
    assert "initialisation" not in h.suggestion
    assert f"from step {h.root.step_start} the updates of '0'" in h.suggestion


def test_the_same_classifier_at_a_sane_learning_rate_neither_saturates_nor_alarms():
    dbg, losses, saturated = train(1e-3)
    assert max(saturated) < 0.05 and statistics.fmean(losses[-8:]) < losses[0]
    assert dbg.hypotheses() == []
