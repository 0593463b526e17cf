"""The README's distributed smoke test: a complete test file, run by the suite as it is printed there."""

import pytest
import torch
from torch import nn

from pytest_neuraldbg import assert_healthy, assert_no_dead_neurons
from pytest_neuraldbg.distributed import smoke_train


def make_model():  # module level: each rank builds its own copy, after torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def make_broken_model():
    model = make_model()
    with torch.no_grad():
        model[2].bias.fill_(-10.0)  # kills every unit of the second ReLU, on every rank
    return model


def shard(rank, world_size):  # each rank's own batches
    g = torch.Generator().manual_seed(rank)
    batches = []
    for _ in range(8):
        x = torch.randn(32, 16, generator=g)
        batches.append((x, x[:, :1] - x[:, 1:2]))
    return batches


def test_ddp_training_is_healthy_on_every_rank():
    job = smoke_train(make_model, shard, nn.functional.mse_loss, world_size=2, wrap="ddp", steps=30)
    assert job.world_size == 2 and job.steps == 30
    assert_healthy(job)


def test_a_dead_layer_is_named_with_the_ranks_that_show_it():
    job = smoke_train(make_broken_model, shard, nn.functional.mse_loss, world_size=2, wrap="ddp", steps=30)
    with pytest.raises(AssertionError, match="dead_neurons at '3' from step 0 on all ranks"):
        assert_no_dead_neurons(job)
