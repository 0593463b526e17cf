"""The CPU step's first look at its gradients: ``surely_finite`` is True only when every value is finite, and may
say "look closer" (False) for huge finite values, which the exact probes then clear; ``probe_sum`` is non-finite
exactly when one probe is."""

from __future__ import annotations

import math

import pytest
import torch

from neuraldbg.stats.tensors import all_dense_on_cpu, dense, device_finite_probes, probe_sum, surely_finite


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_one_non_finite_element_anywhere_is_never_called_surely_finite(bad: float, dtype: torch.dtype) -> None:
    tensors = [torch.ones(5, dtype=dtype), torch.randn(64, 64).to(dtype), torch.zeros(3, dtype=dtype)]
    assert surely_finite(tensors)
    tensors[1][7, 9] = bad
    assert not torch.isfinite(tensors[1]).all()  # plain torch
    assert not surely_finite(tensors)


def test_huge_finite_values_ask_for_a_closer_look_which_clears_them() -> None:
    huge = torch.full((1024,), 1e20)
    assert torch.isfinite(huge).all()  # plain torch: finite, but its float32 norm overflows
    assert math.isinf(float(torch.linalg.vector_norm(huge)))
    assert not surely_finite([torch.ones(3), huge])
    probes = device_finite_probes([torch.ones(3), huge])
    assert all(math.isfinite(float(p)) for p in probes)
    total = probe_sum(probes)
    assert total is not None and math.isfinite(float(total))


def test_the_sum_of_probes_is_non_finite_exactly_when_a_probe_is() -> None:
    tensors = [torch.ones(4), torch.ones(2, dtype=torch.float64), torch.ones(3, dtype=torch.float16)]
    total = probe_sum(device_finite_probes(tensors))
    assert total is not None and float(total) == pytest.approx(2 + 1 + math.sqrt(3))  # float64: the largest magnitude
    tensors[2][1] = -math.inf
    total = probe_sum(device_finite_probes(tensors))
    assert total is not None and float(total) == math.inf
    tensors[0][0] = math.nan
    total = probe_sum(device_finite_probes(tensors))
    assert total is not None and math.isnan(float(total))
    assert probe_sum([]) is None


def test_the_short_way_takes_only_plain_cpu_floats_that_dense_returns_as_they_are() -> None:
    plain = [torch.ones(3), torch.nn.Parameter(torch.ones(2, dtype=torch.float64)), torch.ones(4, dtype=torch.bfloat16)]
    assert all_dense_on_cpu(plain) and all(dense(t) is t for t in plain)
    others = [
        torch.ones(3).to_sparse(),  # dense() gives its values, not the tensor
        torch.ones(3, device="meta"),  # no values
        torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8),  # dense() dequantizes
        torch.ones(3, dtype=torch.complex64),  # not real
    ]
    for other in others:
        assert not all_dense_on_cpu([*plain, other])
