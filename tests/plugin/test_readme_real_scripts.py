"""The README's "Real scripts" example: a complete test file, run by the suite as it is printed there.

What a training script copied from pytorch/examples does inside the watched block: steps through a closure
(LBFGS), saves the whole model every epoch, keeps an averaged copy of the weights, and validates in eval mode.
"""

import copy
import io

import pytest
import torch
from torch import nn

from pytest_neuraldbg import assert_healthy, assert_no_dead_neurons


def make_data(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, torch.sin(x[:, :1]) + 0.5 * x[:, 1:2]


def test_a_closure_based_optimizer_is_observed_step_by_step(neuraldbg):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    x, y = make_data()

    def closure():  # LBFGS evaluates it several times per step
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    with neuraldbg(model) as ndbg:
        for _ in range(10):
            optimizer.step(closure)
    assert ndbg.steps == 10  # one step per optimizer.step(closure), however many evaluations it made
    assert_healthy(ndbg)


def test_saving_copying_and_validating_inside_the_block_is_safe(neuraldbg):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    average = copy.deepcopy(model)  # an exponential moving average of the weights
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = make_data()
    with neuraldbg(model) as ndbg:
        for _epoch in range(3):
            model.train()
            for start in range(0, len(x), 32):
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x[start : start + 32]), y[start : start + 32]).backward()
                optimizer.step()
                with torch.no_grad():
                    for avg, p in zip(average.parameters(), model.parameters()):
                        avg.mul_(0.9).add_(p, alpha=0.1)
            model.eval()
            with torch.no_grad():
                nn.functional.mse_loss(model(x), y)  # validation: not a training step
            torch.save(model, io.BytesIO())  # the whole model, every epoch
            copy.deepcopy(model)  # a best-model copy: it carries no hook of the debugger
    assert ndbg.steps == 24
    assert_healthy(ndbg)


def test_a_bad_bias_is_still_caught_in_such_a_script(neuraldbg):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    with torch.no_grad():
        model[0].bias.fill_(-20.0)  # every unit of the ReLU is dead from the start
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = make_data()
    with neuraldbg(model) as ndbg:
        for _epoch in range(2):
            for start in range(0, len(x), 32):
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x[start : start + 32]), y[start : start + 32]).backward()
                optimizer.step()
            torch.save(model, io.BytesIO())
    with pytest.raises(AssertionError, match="dead_neurons at '1' from step 0"):
        assert_no_dead_neurons(ndbg)
