"""The cheap step's non-finite probe: inf or NaN exactly when the gradient holds an inf or a NaN, never because a
finite value is large (an L2 norm in float32 overflows from about 1.8e19 per element), for every float dtype."""

from __future__ import annotations

import math

import pytest
import torch

from neuraldbg.stats.tensors import device_finite_probes

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def largest_finite(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_probe_is_finite_for_the_largest_finite_values_and_not_for_inf_or_nan(dtype: torch.dtype) -> None:
    huge = torch.full((1000,), largest_finite(dtype), dtype=dtype)
    assert torch.isfinite(huge).all()  # plain torch: every value is finite
    with_inf, with_nan, both = (torch.ones(64, dtype=dtype) for _ in range(3))
    with_inf[3] = -math.inf
    with_nan[5] = math.nan
    both[1], both[2] = math.inf, math.nan
    probes = [float(p) for p in device_finite_probes([huge, with_inf, with_nan, both, torch.zeros(8, dtype=dtype)])]
    assert math.isfinite(probes[0])
    assert probes[1] == math.inf
    assert math.isnan(probes[2]) and math.isnan(probes[3])
    assert probes[4] == 0.0


def test_probes_keep_the_order_of_tensors_of_mixed_dtypes() -> None:
    tensors = [torch.ones(4), torch.full((2,), math.nan, dtype=torch.float64), torch.ones(3, dtype=torch.float16)]
    tensors[0][0] = math.inf
    probes = [float(p) for p in device_finite_probes(tensors)]
    assert probes[0] == math.inf and math.isnan(probes[1]) and probes[2] == pytest.approx(math.sqrt(3))
