"""What watching a model reads of its layers: never a parametrized weight, whose every read may change the run."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from neuraldbg import NeuralDbg


def gan_discriminator() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(spectral_norm(nn.Linear(4, 3)), nn.LeakyReLU(0.2), nn.Linear(3, 1))


def test_watching_a_spectral_norm_layer_leaves_its_power_iteration_where_the_run_left_it() -> None:
    watched, unwatched = gan_discriminator(), gan_discriminator()
    x = torch.randn(8, 4)
    # in train mode every read of the layer's weight moves these vectors one power iteration
    vectors = [(m[0].parametrizations.weight[0]._u, m[0].parametrizations.weight[0]._v) for m in (watched, unwatched)]

    with NeuralDbg(watched):
        assert all(torch.equal(a, b) for a, b in zip(vectors[0], vectors[1], strict=True))
        watched(x).pow(2).mean().backward()
    unwatched(x).pow(2).mean().backward()

    assert all(torch.equal(a, b) for a, b in zip(vectors[0], vectors[1], strict=True))
    assert torch.equal(watched[0].weight, unwatched[0].weight)
