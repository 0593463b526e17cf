"""The CPU step's first look at its gradients: ``surely_finite`` is True only when every value is finite, and may
say "look closer" (False) for huge finite values, which the exact probes then clear; ``probe_sum`` is non-finite
exactly when one probe is."""

from __future__ import annotations

import math

import pytest
import torch

from neuraldbg.stats.tensors import (
    MIN_GROUP,
    FlatSum,
    all_dense_on_cpu,
    dense,
    dense_cpu_dtypes,
    device_finite_probes,
    flat_check_pays,
    probe_sum,
    surely_finite,
)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# (dtype, flat): the flat sum is for float32 lists only (see flat_check_pays)
WAYS = [(dtype, False) for dtype in DTYPES] + [(torch.float32, True)]


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize(("dtype", "flat"), WAYS)
@pytest.mark.parametrize("side", [64, 128], ids=["normed", "summed-alone"])  # 128x128 float32: _SUM_ALONE's way
@pytest.mark.parametrize("where", [0, 1, 2])
def test_one_non_finite_element_anywhere_is_never_called_surely_finite(
    bad: float, dtype: torch.dtype, flat: bool, side: int, where: int
) -> None:
    tensors = [torch.ones(5, dtype=dtype), torch.randn(side, side).to(dtype), torch.zeros(3, dtype=dtype)]
    assert surely_finite(tensors, flat=flat)
    tensors[where].view(-1)[2] = bad
    assert not torch.isfinite(tensors[where]).all()  # plain torch
    assert not surely_finite(tensors, flat=flat)


def test_an_inf_and_a_minus_inf_in_one_flat_sum_are_still_found() -> None:
    tensors = [torch.ones(4), torch.ones(4)]
    tensors[0][1], tensors[1][2] = math.inf, -math.inf
    assert not surely_finite(tensors, flat=True)  # inf - inf is NaN: not finite


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("size", [1024, 16384], ids=["normed", "summed-alone"])
def test_huge_finite_values_ask_for_a_closer_look_which_clears_them(flat: bool, size: int) -> None:
    huge = torch.full((size,), 1e36)
    assert torch.isfinite(huge).all()  # plain torch: finite, but its float32 norm and its sum overflow
    assert math.isinf(float(torch.linalg.vector_norm(huge))) and math.isinf(float(huge.sum()))
    assert not surely_finite([torch.ones(3), huge], flat=flat)
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
        assert dense_cpu_dtypes([*plain, other]) is None


def test_the_one_pass_check_names_the_dtypes_the_flat_sum_needs() -> None:
    mixed = [torch.ones(3), torch.nn.Parameter(torch.ones(2, dtype=torch.float64))]
    assert dense_cpu_dtypes(mixed) == {torch.float32, torch.float64}  # not all float32: no flat sum
    assert dense_cpu_dtypes(mixed[:1] * 3) == {torch.float32}


def test_the_flat_sum_is_taken_for_many_small_float32_tensors_only() -> None:
    deep = [t for _ in range(200) for t in (torch.ones(32, 32), torch.ones(32))]  # a 200-layer narrow MLP
    assert flat_check_pays(deep)
    wide = [t for _ in range(8) for t in (torch.ones(512, 512), torch.ones(512))]  # an 8x512 MLP: 130k on average
    assert not flat_check_pays(wide)
    assert not flat_check_pays([torch.ones(4096, 2048)] * 600)  # small enough on average, too large in all
    assert not flat_check_pays([t.half() for t in deep])  # a float16 sum overflows at 65504
    assert not flat_check_pays([])


def _narrow(layers: int, odd: int = 2) -> list[torch.Tensor]:
    """The gradients of a narrow MLP's layers (a weight and a bias each, shapes repeating), and ``odd`` odd ones."""
    torch.manual_seed(0)
    odd_ones = [torch.randn(3, 5), torch.randn(7)][:odd]
    return [t for _ in range(layers) for t in (torch.randn(8, 8), torch.randn(8))] + odd_ones


def test_the_plan_stacks_the_shapes_that_repeat_and_copies_the_others_flat() -> None:
    plan = FlatSum([t.shape for t in _narrow(12)])
    assert plan.size == 26 and plan.groups == [12, 12] and plan.rest == 2
    few = FlatSum([t.shape for t in _narrow(MIN_GROUP - 1)])  # too few of a shape to stack
    assert few.groups == [] and few.rest == 2 * (MIN_GROUP - 1) + 2


@pytest.mark.parametrize(("layers", "odd"), [(12, 2), (12, 1), (12, 0), (MIN_GROUP - 1, 2), (30, 2)])
def test_the_planned_sum_is_the_sum_of_every_value(layers: int, odd: int) -> None:
    tensors = _narrow(layers, odd)
    plan = FlatSum([t.shape for t in tensors])
    expected = sum(float(t.double().sum()) for t in tensors)  # plain torch, one by one, in float64
    assert float(plan.total(tensors)) == pytest.approx(expected, rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("where", [0, 13, 25])  # a stacked weight, a stacked bias, one of the odd tensors
def test_one_non_finite_element_in_a_planned_sum_is_never_called_surely_finite(bad: float, where: int) -> None:
    tensors = _narrow(12)
    plan = FlatSum([t.shape for t in tensors])
    assert surely_finite(tensors, flat=True, plan=plan)
    tensors[where].view(-1)[2] = bad
    assert not all(bool(torch.isfinite(t).all()) for t in tensors)  # plain torch
    assert not surely_finite(tensors, flat=True, plan=plan)


def test_a_list_whose_shapes_no_longer_fit_the_plan_is_summed_as_one_flat_copy() -> None:
    """A parameter given new data of another shape: its gradient no longer stacks with the others."""
    tensors = _narrow(12)
    plan = FlatSum([t.shape for t in tensors])
    tensors[4] = torch.ones(8, 9)  # was 8x8, stacked with the other weights
    expected = sum(float(t.double().sum()) for t in tensors)
    assert float(plan.total(tensors)) == pytest.approx(expected, rel=1e-5, abs=1e-4)
    tensors[4][1, 1] = math.nan
    assert not surely_finite(tensors, flat=True, plan=plan)
