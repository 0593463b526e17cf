"""Training-health tests for the tiny project, written with the ``neuraldbg`` fixture of pytest-neuraldbg.

Run from the repository root::

    pytest examples -p no:cacheprovider --neuraldbg-gate --neuraldbg-report=neuraldbg-report
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model import build_model, make_data


def test_the_model_trains_healthily(neuraldbg):
    torch.manual_seed(0)
    model = build_model()

    ndbg = neuraldbg.smoke_train(model, make_data(), F.cross_entropy, steps=40)

    neuraldbg.assert_healthy(ndbg)


def test_a_hand_written_training_loop_is_healthy(neuraldbg):
    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    with neuraldbg(model) as ndbg:
        for _epoch in range(4):
            for inputs, labels in make_data():
                optimizer.zero_grad()
                loss = F.cross_entropy(model(inputs), labels)
                ndbg.observe_loss(loss)  # optional: lets the report show the loss curve
                loss.backward()
                optimizer.step()

    assert not ndbg.explain_failure()


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="deliberately broken: shows how NeuralDBG fails it")
@pytest.mark.neuraldbg(gate="fail")  # this test is gated even without --neuraldbg-gate
def test_a_dead_relu_layer_is_caught(neuraldbg):
    torch.manual_seed(0)
    model = build_model(broken=True)

    neuraldbg.smoke_train(model, make_data(), F.cross_entropy, steps=40)
    # no assertion: the gate fails a test whose watched training is unhealthy, by itself
