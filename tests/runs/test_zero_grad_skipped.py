"""How many carried-over steps make ``gradients_not_zeroed``: one skipped ``zero_grad()`` (a loop's odd iteration)
is tolerated, two are reported, dated from the first. Pins ``MIN_STEPS`` of the room: setting it to 1 passed every
test before this file (found by a mutation pass over the rooms).

Ground truth by plain torch: at the start of each backward pass, whether the first layer's ``.grad`` is still the
gradient the optimizer applied at the previous step."""

from __future__ import annotations

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 30


@pytest.mark.parametrize(("skipped", "reported"), [((), False), ((12,), False), ((12, 20), True)])
def test_one_skipped_zero_grad_is_tolerated_and_two_are_reported(skipped: tuple[int, ...], reported: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    make = support.classification_batches((32,), 10, batch=64)
    carried = []
    with NeuralDbg(model) as dbg:
        applied = None
        for step in range(STEPS):
            x, y = make(step)
            if step not in skipped:
                opt.zero_grad()
            before = model[0].weight.grad
            carried.append(before is not None and applied is not None and torch.equal(before, applied))
            F.cross_entropy(model(x), y).backward()
            applied = model[0].weight.grad.clone()
            opt.step()
    assert [step for step, c in enumerate(carried) if c] == list(skipped)  # the ground truth, in plain torch
    found = [h for h in dbg.hypotheses() if h.kind is FailureKind.GRADIENTS_NOT_ZEROED]
    assert bool(found) is reported, dbg.report()
    if reported:
        assert found[0].root.step_start == skipped[0]
