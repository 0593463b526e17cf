"""Non-finite values, rooted where they were born (checked with plain torch): a NaN batch, a layer that makes them,
a loss that turns NaN while outputs are finite."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import EventType, FailureKind

# --------------------------------------------------------------------------------------------- non-finite


def test_a_nan_batch_at_step_k_is_a_data_problem_at_step_k():
    torch.manual_seed(0)
    model = support.mlp()
    clean = support.regression_batches()

    def batches(step: int) -> support.Batch:
        x, y = clean(step)
        if step == 23:
            x = x.clone()
            x[4, 2] = float("nan")
        return x, y

    dbg, _ = support.train(model, batches)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NON_FINITE
    assert top.root.event_type is EventType.INPUT
    assert top.root.layer == ""
    assert top.root.step_start == 23
    assert "input batch at step 23" in top.explanation
    assert len(dbg.hypotheses()) == 1


class LogLayer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)  # NaN for negative inputs


def test_a_non_finite_value_born_inside_a_layer_is_blamed_on_that_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), LogLayer(), nn.Linear(32, 1))
    batches = support.regression_batches()
    outs = support.capture_outputs(model, batches(0)[0], ["2", "3"])
    assert bool(torch.isfinite(outs["2"]).all()) and not bool(torch.isfinite(outs["3"]).all())

    dbg, _ = support.train(model, batches, steps=10)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NON_FINITE
    assert top.root.layer == "3"
    assert top.root.step_start == 0


def test_a_loss_that_turns_nan_while_outputs_are_finite_is_blamed_on_the_loss():
    torch.manual_seed(0)
    model = support.mlp()
    calls = [0]

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(out, target)
        if calls[0] >= 12:
            loss = loss + torch.log(out.sum() * 0.0)  # log(0): the loss, not the model, goes non-finite
        calls[0] += 1
        return loss

    dbg, losses = support.train(model, support.regression_batches(), loss_fn, steps=20)
    assert torch.isfinite(torch.tensor(losses[11])) and not torch.isfinite(torch.tensor(losses[12]))

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NON_FINITE
    assert top.root.event_type is EventType.LOSS
    assert top.root.step_start == 12
