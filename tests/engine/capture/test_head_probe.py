"""A cheap CPU step reads one element of the head layer's gradient: an outlier batch shows as a jump of it against
its running mean, and the steps after it are fully observed. The element read was always the first; when the head's
first input unit is dead, that element's gradient is exactly zero on every step, and no jump ever showed; when that
unit is nearly dead (positive on a sample now and then), its element's running mean is tiny and ordinary batches
looked like outliers. Ground truth is plain torch in each test: the dead unit's column of the head gradient is
exactly zero, the nearly dead unit is positive on under 1 % of the samples, and the outlier batch's head gradient is
far above the others'."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.stats.step import StepData

SPIKE = 300  # a cheap step: full steps are every 64th after step 256
FACTOR = 300.0  # a ReLU net's head gradient grows with its input: two orders of magnitude


def _model(dead_first_input: bool | str, head_bias: bool = True) -> nn.Sequential:
    """``dead_first_input``: True (a ReLU whose input is always -1), "nearly" (its bias lowered by 0.5: positive
    on a sample now and then) or False."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4, bias=head_bias))
    with torch.no_grad():
        if dead_first_input == "nearly":
            model[2].bias[0] -= 0.5
        elif dead_first_input:
            model[2].weight[0] = 0.0
            model[2].bias[0] = -1.0
    return model


def _batch(step: int, spike: int | None) -> support.Batch:
    x, y = support.classification_batches((16,), 4, batch=32)(step)
    return (x * FACTOR if step == spike else x), y


def _train(model: nn.Module, steps: int, spike: int | None, watched: bool) -> tuple[list[StepData], list[float]]:
    """SGD 0.01 on cross-entropy; the records the debugger filed (raw, before the analysis), and the norm of the
    head gradient at each step (plain torch)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    records: list[StepData] = []
    norms: list[float] = []
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        analysis = dbg._recorder._sink

        def sink(batch: list[StepData]) -> bool | None:
            records.extend(batch)
            return analysis(batch)

        dbg._recorder._sink = sink
        dbg.attach()
    try:
        for step in range(steps):
            x, y = _batch(step, spike)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            head = model[4].weight.grad
            assert head is not None
            norms.append(float(head.norm()))
            opt.step()
    finally:
        if dbg is not None:
            dbg.close()
    return records, norms


def _full_after_spike(records: list[StepData]) -> list[int]:
    return [r.step for r in records if r.full and SPIKE < r.step < SPIKE + 10]


def test_the_dead_input_gives_the_first_element_of_the_head_gradient_exactly_zero_and_the_spike_is_an_outlier():
    model = _model(dead_first_input=True)
    _, norms = _train(model, SPIKE + 1, SPIKE, watched=False)
    typical = sorted(norms[SPIKE - 40 : SPIKE])[20]
    assert norms[SPIKE] > 100 * typical  # the outlier batch's head gradient
    x, y = _batch(0, None)
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    assert model[4].weight.grad is not None
    assert bool((model[4].weight.grad[:, 0] == 0).all())  # the dead unit's column: no gradient at all
    assert bool(model[4].weight.grad.any())  # ... while the rest of the head gets one


def test_the_nearly_dead_input_is_positive_on_under_one_sample_in_a_hundred_but_not_on_none():
    model = _model("nearly")
    positive = [(model[:4](_batch(step, None)[0])[:, 0] > 0).float().mean().item() for step in range(0, 400, 4)]
    assert 0 < sum(positive) / len(positive) < 0.01


# (the head's first input dead, nearly dead or alive; the head has a bias)
CASES: list[tuple[bool | str, bool]] = [(False, True), (True, True), (True, False), ("nearly", True)]


def test_an_outlier_batch_is_followed_by_fully_observed_steps_whatever_the_heads_first_input():
    for dead, bias in CASES:
        records, _ = _train(_model(dead, bias), SPIKE + 10, SPIKE, watched=True)
        assert _full_after_spike(records) == list(range(SPIKE + 1, SPIKE + 9)), (dead, bias)


def test_without_the_outlier_those_steps_are_cheap():
    for dead, bias in CASES:
        records, _ = _train(_model(dead, bias), SPIKE + 10, None, watched=True)
        assert _full_after_spike(records) == [], (dead, bias)


def test_ordinary_batches_open_no_window_when_the_first_input_is_nearly_dead():
    records, _ = _train(_model("nearly"), 700, None, watched=True)
    assert [r.step for r in records if r.full and r.step >= 256 and r.step % 64] == []  # the regular schedule only
