"""OutputScales: the output scale of each layer that holds parameters, from a fully observed step's readings (a
layer's output norm over the square root of its element count), its first reading kept, the layers in the order
they first produced an output."""

from __future__ import annotations

import math

from neuraldbg.stats.outputs import OutputScales
from neuraldbg.stats.step import StepData


def record(step: int, fc: float, act: float) -> StepData:
    data = StepData(step=step, full=True)
    data.act = {("fc", 0): fc * 10.0, ("act", 0): act * 10.0, ("fc", 1): fc * 5.0}
    data.numel = {("fc", 0): 100, ("act", 0): 100, ("fc", 1): 100}
    data.grad = {"fc.weight": 1.0, "fc.bias": 0.5}  # 'act' holds no parameters
    return data


def test_only_layers_with_parameters_are_kept_with_their_first_scale_and_series():
    scales = OutputScales()
    for step, (fc, act) in enumerate([(1.0, 0.5), (0.5, 0.0), (0.25, 0.0)]):
        scales.observe(record(step, fc, act))
    assert scales.order == ["fc"]  # the activation's collapse is its dead units', not a layer's
    assert scales.start["fc"] == 1.0  # norm 10 over sqrt(100); the second call (norm 5) is smaller
    assert [v for _, v in scales.series["fc"].points()] == [1.0, 0.5, 0.25]


def test_a_non_finite_norm_or_an_unknown_element_count_is_not_a_scale():
    scales = OutputScales()
    data = record(0, 1.0, 1.0)
    data.act[("fc", 0)] = math.inf
    data.act[("fc", 1)] = 3.0
    data.numel[("fc", 1)] = 0
    scales.observe(data)
    assert scales.order == []
