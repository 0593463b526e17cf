"""NaN labels handed to a model that computes its own loss (the Hugging Face convention, ``model(x, labels=y)``)
are bad data, whichever argument carries them: the model's input is finite, its loss is not."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.events import EventType


class OwnLoss(nn.Module):
    """A regressor that returns its loss first, as transformers' models do when given labels."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, labels: torch.Tensor | None = None):
        out = self.body(x)
        if mask is not None:
            out = out + mask.amax(dim=1, keepdim=True).clamp(min=-1.0)  # a finite effect of a -inf mask
        loss = F.mse_loss(out, labels) if labels is not None else out.sum()
        return loss, out


def train(bad_step: int | None, steps: int = 40, mask: bool = False) -> tuple[NeuralDbg, list[float]]:
    torch.manual_seed(0)
    model = OwnLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    losses = []
    with NeuralDbg(model) as dbg:
        for step in range(steps):
            x = torch.randn(32, 6, generator=g)
            y = x[:, :1] * 0.5
            if step == bad_step:
                y = y.clone()
                y[3] = math.nan
            m = torch.zeros(32, 4)
            m[:, 2] = -math.inf  # an additive mask: -inf is how masking works, not bad data
            opt.zero_grad()
            loss, _ = model(x, mask=m if mask else None, labels=y)
            losses.append(loss.item())
            loss.backward()
            opt.step()
    return dbg, losses


@pytest.mark.parametrize("bad_step", [0, 21])  # a fully observed step and a cheap one
def test_nan_labels_passed_to_the_model_are_a_data_problem_at_their_step(bad_step: int) -> None:
    dbg, losses = train(bad_step)
    assert not math.isfinite(losses[bad_step])  # plain torch: finite inputs, and the loss is NaN from that step
    assert all(math.isfinite(v) for v in losses[:bad_step])
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NON_FINITE, dbg.explain_failure()
    assert top.root.event_type is EventType.INPUT and top.root.step_start == bad_step, dbg.explain_failure()


def test_a_minus_inf_mask_beside_finite_labels_is_not_bad_data() -> None:
    dbg, losses = train(None, mask=True)
    assert all(math.isfinite(v) for v in losses)
    assert not any(h.kind is FailureKind.NON_FINITE for h in dbg.hypotheses()), dbg.explain_failure()
