"""Saturated activations on a model that truly has them (checked with plain torch), and a confident final sigmoid
that must not count."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind

# --------------------------------------------------------------------------------------------- saturation


def test_tanh_saturated_from_init_is_rooted_at_the_first_saturated_layer_at_step_0():
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=4, act=nn.Tanh)
    with torch.no_grad():
        for i in (0, 2, 4, 6):
            model[i].weight.mul_(20.0)
    batches = support.regression_batches()
    out = support.capture_outputs(model, batches(0)[0], ["1"])["1"]
    assert float((out.abs() > 0.995).float().mean()) > 0.5  # plain torch: most outputs pinned at +-1

    dbg, _ = support.train(model, batches, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3))

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.SATURATED_ACTIVATIONS
    assert top.root.layer == "1"
    assert top.root.step_start == 0


def test_a_confident_final_sigmoid_is_not_saturation():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())
    with torch.no_grad():
        model[2].weight.mul_(30.0)  # outputs pinned near 0/1 from the start: the classifier is just confident
    gen = support.classification_batches((16,), 2)

    def batches(step: int) -> support.Batch:
        x, y = gen(step)
        return x, y.float().unsqueeze(1)

    dbg, _ = support.train(model, batches, F.binary_cross_entropy)
    assert FailureKind.SATURATED_ACTIVATIONS not in {h.kind for h in dbg.hypotheses()}
