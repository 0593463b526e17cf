"""The batched reductions of full steps (one stacked reduction per shape, a packed snapshot) against the one-tensor
reductions they replace, and against plain torch."""

from __future__ import annotations

import math

import pytest
import torch

from neuraldbg.stats import tensors as stats


def _mixed() -> list[torch.Tensor]:
    """Ten tensors of one small shape (a stacked group) interleaved with others: the plan must restore the order."""
    g = torch.Generator().manual_seed(0)
    group = [torch.randn(4, 8, generator=g) * (i + 1) for i in range(10)]
    others = [torch.randn(3, generator=g), torch.randn(5, 7, generator=g).t(), torch.randn(2, 2, 2, generator=g)]
    return [others[0], *group[:4], others[1], *group[4:], others[2]]


@pytest.mark.parametrize("ord", [2.0, math.inf])
def test_norm_readings_of_many_tensors_equal_each_tensors_norm_in_order(ord: float):
    tensors = _mixed()
    plan = stats.NormPlan.of(tensors)
    assert plan.stacked and plan.singles  # both paths run
    got = stats.norm_readings(tensors, ord)
    assert isinstance(got, torch.Tensor)
    want = torch.stack([torch.linalg.vector_norm(t, ord) for t in tensors])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


def test_large_tensors_of_one_shape_are_reduced_one_by_one_and_small_ones_stacked():
    """A stack copies its tensors: above STACK_LIMIT elements each, that copy costs more than the launches it saves
    (the 8x512 MLP's layer outputs of 128x512), so such a group goes through one ``_foreach_norm``. Either way each
    norm is the tensor's own."""
    g = torch.Generator().manual_seed(2)
    small = [torch.randn(32, 256, generator=g) for _ in range(stats.MIN_GROUP)]  # 8,192 elements: a stack pays
    large = [torch.randn(128, 512, generator=g) for _ in range(stats.MIN_GROUP)]  # 65,536: a stack costs 2.8x
    for tensors, stacked in ((small, True), (large, False)):
        plan = stats.NormPlan.of(tensors)
        assert bool(plan.stacked) is stacked and bool(plan.singles) is not stacked
        want = torch.stack([torch.linalg.vector_norm(t) for t in tensors])
        torch.testing.assert_close(stats.norm_readings(tensors), want, rtol=1e-6, atol=0)


def test_a_non_finite_element_gives_a_non_finite_batched_norm_of_its_own_tensor_only():
    tensors = _mixed()
    tensors[6] = tensors[6].clone()
    tensors[6][1, 2] = float("nan")
    got = stats.norm_readings(tensors)
    assert isinstance(got, torch.Tensor)
    assert [i for i, v in enumerate(got.tolist()) if not math.isfinite(v)] == [6]


@pytest.mark.parametrize(
    ("shape", "channel_first"), [((32, 16), False), ((8, 6, 12), False), ((8, 6, 5, 5), True), ((8, 6, 12), True)]
)
@pytest.mark.parametrize("fraction", [0.0, 0.25])
def test_stacked_dead_units_equal_each_outputs_count(shape: tuple[int, ...], channel_first: bool, fraction: float):
    g = torch.Generator().manual_seed(1)
    outs = []
    for i in range(9):
        o = torch.randn(shape, generator=g).relu()
        o.movedim(stats.unit_dim(o, channel_first), -1)[..., : i % 4] = 0.0  # i % 4 dead units
        o.movedim(0, -1)[..., :2] = 0.0  # two samples on which every unit is silent (the fraction counts them)
        outs.append(o)
    got = stats.dead_units_stacked(torch.stack(outs), channel_first, fraction)
    want = torch.stack([stats.dead_units(o, channel_first, fraction) for o in outs])
    assert got.tolist() == want.tolist()
    assert len(set(want.tolist())) > 1  # the outputs differ: a count taken from the wrong output would show


@pytest.mark.parametrize("grad_shape", [(6, 5), (6, 2, 3, 3)])
def test_stacked_dead_and_still_units_equal_each_layers_count(grad_shape: tuple[int, ...]):
    """Units never positive and with a weight row of exact zeros, per layer: rows that are zero only at one end
    (their smallest or their largest element 0) are not still, units positive somewhere are not dead."""
    g = torch.Generator().manual_seed(4)
    nevers, grads = [], []
    for i in range(9):
        pre = torch.randn(8, grad_shape[0], generator=g)
        pre[:, : i % 3 + 3] = -1.0  # never positive: the still rows and the two zero at one end only
        grad = torch.randn(grad_shape, generator=g)
        grad[: i % 3 + 1] = 0.0  # still rows
        grad[i % 3 + 1] = grad[i % 3 + 1].abs()
        grad[i % 3 + 1].flatten()[0] = 0.0  # smallest element 0, largest positive
        grad[i % 3 + 2] = -grad[i % 3 + 2].abs()
        grad[i % 3 + 2].flatten()[0] = 0.0  # largest element 0, smallest negative
        nevers.append(stats.never_positive(pre, False))
        grads.append(grad)
    got = stats.dead_and_still_stacked(torch.stack(nevers), torch.stack(grads))
    want = [float((n & stats.zero_gradient_units(gr)).sum()) for n, gr in zip(nevers, grads)]
    assert got.tolist() == want
    assert len(set(want)) > 1


def test_stacked_saturation_equals_each_outputs_count():
    g = torch.Generator().manual_seed(2)
    outs = [torch.tanh(torch.randn(16, 10, generator=g) * (i + 1)) for i in range(9)]
    got = stats.saturated_stacked(torch.stack(outs), 0.0, 0.99)
    want = [float(stats.saturated_count(o, 0.0, 0.99)) for o in outs]
    assert got.tolist() == want
    assert len(set(want)) > 1


def test_a_packed_snapshot_measures_each_parameters_change_and_new_norm():
    g = torch.Generator().manual_seed(3)
    params = [torch.randn(4, 8, generator=g) for _ in range(9)] + [torch.randn(300, 300, generator=g)]
    names = [f"p{i}" for i in range(len(params))]
    plan = stats.SnapshotPlan(names, params)
    snapshot = plan.take()
    before = [p.clone() for p in params]
    for i, p in enumerate(params):
        p.add_(torch.randn(p.shape, generator=g) * 0.01 * (i + 1))
    deltas, weights, old = snapshot.readings()
    assert isinstance(deltas, torch.Tensor) and isinstance(weights, torch.Tensor)
    for i, (p, b) in enumerate(zip(params, before, strict=True)):
        assert weights[i].item() == pytest.approx(p.norm().item(), rel=1e-5)
        if p.numel() <= stats.SAMPLE:
            assert deltas[i].item() == pytest.approx((p - b).norm().item(), rel=1e-4)
    # the 90k-element parameter is sampled: its sample's change scaled up estimates the whole change
    big = len(params) - 1
    assert plan.sampled == [big]
    # every parameter's norm before the step, in the parameters' order (the oversized-update check reads them all)
    assert [o.item() for o in old] == pytest.approx([b.norm().item() for b in before], rel=1e-5)
    scale = plan.scales[big]
    assert deltas[big].item() * scale == pytest.approx((params[big] - before[big]).norm().item(), rel=0.05)


def test_a_snapshot_plan_is_invalid_once_a_parameter_gets_new_storage():
    params = [torch.zeros(4, 8) for _ in range(3)]
    plan = stats.SnapshotPlan(["a", "b", "c"], params)
    assert plan.valid_for(params)
    moved = [params[0], torch.zeros(4, 8), params[2]]
    assert not plan.valid_for(moved)


def test_stacked_largest_magnitudes_equal_each_tensors_own_with_zeros_and_non_finite_elements():
    """The largest magnitude of a stacked group (abs and amax) is exactly each tensor's ``vector_norm(inf)``: an
    all-zero tensor 0, a NaN NaN, an inf or a -inf inf, signed zeros 0, whatever else the tensor holds."""
    g = torch.Generator().manual_seed(3)
    tensors = [torch.randn(16, 8, generator=g) * 10 ** (i - 6) for i in range(12)]
    tensors[1].zero_()
    tensors[2][3, 4] = float("nan")
    tensors[3][0, 0] = float("inf")
    tensors[4][5, 1] = -float("inf")
    tensors[5][2, 2], tensors[5][2, 3] = float("nan"), float("inf")
    tensors[6] = -torch.zeros(16, 8)
    plan = stats.NormPlan.of(tensors)
    assert plan.stacked and not plan.singles
    got = stats.norm_readings(tensors, math.inf)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    want = torch.stack([torch.linalg.vector_norm(t, math.inf) for t in tensors])
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())  # bit for bit elsewhere
    assert got[1].item() == 0.0 and math.isnan(got[2].item()) and got[3].item() == got[4].item() == math.inf


@pytest.mark.parametrize("count", [4, stats.MIN_GROUP + 2])
def test_largest_magnitudes_of_large_and_small_tensors_equal_each_tensors_own(count: int):
    """Tensors of at least MAGNITUDE_APART elements (taken apart, by their largest and smallest values) beside small
    ones (one ``_foreach_norm(inf)``), fewer than a group or in a plan's singles: each one's ``vector_norm(inf)``,
    in order, with an all-zero, a NaN, an inf and a -inf among them."""
    g = torch.Generator().manual_seed(5)
    big = stats.MAGNITUDE_APART
    tensors = [
        torch.randn(big // 64 + i, 64, generator=g) if i % 2 else torch.randn(5 + i, generator=g) for i in range(count)
    ]
    tensors[0] = torch.zeros(big * 2)
    tensors[1][3, 4] = float("nan")
    tensors[2][1] = -float("inf")
    tensors[-1] = -torch.rand(big, generator=g) * 7  # every value negative: the largest magnitude is -min
    assert any(t.numel() >= big for t in tensors) and any(t.numel() < big for t in tensors)
    got = stats.norm_readings(tensors, math.inf)
    assert isinstance(got, torch.Tensor)
    want = torch.stack([torch.linalg.vector_norm(t, math.inf) for t in tensors])
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    assert stats.largest_magnitudes(tensors)[-1] == -float(tensors[-1].min())
