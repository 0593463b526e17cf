"""Oracle tests: every statistic of ``neuraldbg.stats.tensors`` against a brute-force torch computation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from neuraldbg.stats import tensors as stats


def test_norms_match_vector_norm_for_every_dtype_and_mixed_lists():
    torch.manual_seed(0)
    tensors = [
        torch.randn(7, 3),
        torch.randn(5).half() * 300,  # a float16 norm of these overflows unless reduced in float32
        torch.randn(2, 2, 2).bfloat16(),
        torch.randn(4, dtype=torch.float64),
        torch.zeros(3),
    ]
    got = stats.norms(tensors)
    for t, g in zip(tensors, got, strict=True):
        expected = torch.linalg.vector_norm(t.double()).item()
        assert g.dtype == torch.float32
        assert math.isclose(g.item(), expected, rel_tol=1e-2 if t.dtype != torch.float32 else 1e-6)


def test_norms_propagate_nan_and_inf():
    got = stats.norms([torch.tensor([1.0, float("nan")]), torch.tensor([float("inf"), 0.0])])
    assert math.isnan(got[0].item()) and math.isinf(got[1].item())


def brute_dead_units(t: torch.Tensor, unit_dim: int, sample_fraction: float) -> int:
    moved = t.movedim(unit_dim, -1)
    n, units = moved.shape[0], moved.shape[-1]
    per_sample = moved.reshape(n, -1, units)
    dead = 0
    for u in range(units):
        active_samples = sum(1 for i in range(n) if bool((per_sample[i, :, u] > 0).any()))
        if active_samples <= int(sample_fraction * n):
            dead += 1
    return dead


@pytest.mark.parametrize(
    ("shape", "channel_first", "unit_dim"),
    [((64, 10), False, 1), ((16, 6, 5, 5), True, 1), ((8, 7, 12), False, 2), ((8, 12, 7), True, 1)],
)
@pytest.mark.parametrize("fraction", [0.0, 0.1])
def test_dead_units_match_a_per_unit_per_sample_count(shape, channel_first, unit_dim, fraction):
    g = torch.Generator().manual_seed(3)
    t = torch.relu(torch.randn(*shape, generator=g) - 1.2)
    t.select(unit_dim, 0).zero_()  # one unit dead everywhere
    t.select(0, 0).select(unit_dim - 1, 1).fill_(1.0)  # one unit active on a single sample only
    got = stats.dead_units(t, channel_first, fraction).item()
    assert got == brute_dead_units(t, unit_dim, fraction)
    assert stats.unit_count(t, channel_first) == shape[unit_dim]


def test_never_positive_and_zero_gradient_units_match_brute_force():
    t = torch.randn(32, 6)
    t[:, 2] = -t[:, 2].abs()
    never = stats.never_positive(t, channel_first=False)
    assert never.tolist() == [bool((t[:, u] <= 0).all()) for u in range(6)]
    grad = torch.randn(6, 4, 3)
    grad[1] = 0
    grad[4, 0, 0] = 1e-30  # tiny but not zero
    grad[4, 1:] = 0
    grad[4, 0, 1:] = 0
    zero = stats.zero_gradient_units(grad)
    assert zero.tolist() == [bool((grad[u] == 0).all()) for u in range(6)]


def test_zero_gradient_units_with_signed_zeros_and_non_finite_rows():
    """A row of signed zeros received no gradient; a row holding a NaN, an inf or a -inf (among zeros) did."""
    grad = torch.zeros(7, 5)
    grad[0] = -0.0
    grad[1, 3] = float("nan")
    grad[2, 0] = float("inf")
    grad[3, 4] = -float("inf")
    grad[4, 2] = -1e-40  # a negative subnormal
    grad[5] = torch.tensor([-0.0, 0.0, -0.0, 0.0, -0.0])
    zero = stats.zero_gradient_units(grad)
    assert zero.tolist() == [True, False, False, False, False, True, True]
    assert zero.tolist() == [bool((grad[u] == 0).all()) for u in range(7)]


@pytest.mark.parametrize(
    ("shape", "channel_first", "unit_dim"),
    [((4, 5, 6, 7), True, 1), ((4, 6, 7, 5), False, 3), ((3, 8, 5), False, 2), ((3, 5, 8), True, 1), ((9,), True, 0)],
)
def test_never_positive_of_maps_and_sequences_matches_brute_force(shape, channel_first, unit_dim):
    torch.manual_seed(1)
    t = torch.randn(shape)
    if t.dim() > 1:
        t.select(unit_dim, 1).copy_(-t.select(unit_dim, 1).abs())  # a unit never positive anywhere
        t.select(unit_dim, 2).copy_(-t.select(unit_dim, 2).abs())
        at = [-1] * t.dim()
        at[unit_dim] = 2
        t[tuple(at)] = 0.5  # ... and one positive at a single element (the last sample's)
        at[unit_dim] = 3
        t[tuple(at)] = float("nan")  # NaN: not "never positive"
    never = stats.never_positive(t, channel_first)
    moved = t.movedim(unit_dim, -1).reshape(-1, shape[unit_dim]) if t.dim() > 1 else t.reshape(-1, 1).T
    expected = [bool((moved[:, u] <= 0).all()) for u in range(moved.shape[1])] if t.dim() > 1 else (t <= 0).tolist()
    assert never.tolist() == expected
    if t.dim() > 1:
        assert never[1] and not never[2] and not never[3]


def test_output_dead_pulled_counts_image_channels_the_loss_pulls_on():
    from neuraldbg.capture.measure import output_dead_pulled
    from neuraldbg.capture.pending import Pending

    torch.manual_seed(2)
    out = torch.randn(4, 5, 3, 3)  # a segmentation head's logits: channels are the units
    out[:, 1] = -out[:, 1].abs()  # never positive, pulled on below
    out[:, 3] = -out[:, 3].abs()  # never positive, its gradient all zero
    out[:, 4] = -out[:, 4].abs()
    out[2, 4, 1, 1] = 1.0  # positive at one pixel of one sample: alive
    grad = torch.randn(4, 5, 3, 3)
    grad[:, 3] = 0
    grad[:, 1] = 0
    grad[3, 1, 2, 0] = 1e-6  # one pixel of one sample pulls on channel 1 (its smallest is 0: the largest tells)
    out[:, 0] = -out[:, 0].abs()  # never positive, pulled on by a negative gradient only ...
    grad[:, 0] = 0
    grad[1, 0, 0, 2] = -3.0  # ... one negative entry among zeros (its largest is 0: the smallest tells)
    pending = Pending(0, True)
    output_dead_pulled(pending, out, grad)
    pending.file([t.item() for t in pending.tensors], [])
    never = [bool((out[:, c] <= 0).all()) for c in range(5)]
    pulled = [bool((grad[:, c] != 0).any()) for c in range(5)]
    assert pending.data.output_dead_pulled == (sum(n and p for n, p in zip(never, pulled)), 5) == (2, 5)


def test_sample_outcomes_hits_take_the_first_of_tied_largest_entries_as_argmax_does():
    log_probs = torch.randn(6, 4).log_softmax(1)
    log_probs[0] = -math.log(4)  # a zero-initialised head: every class tied
    log_probs[1] = -math.log(4)
    log_probs[2, 1] = float("nan")  # NaN: argmax picks it
    target = torch.tensor([0, 2, 1, 3, 1, -100])
    losses, hits = stats.sample_outcomes(log_probs, target, -100, 6)
    expected = [float(int(log_probs[i].argmax()) == int(target[i])) for i in range(5)]
    assert hits[:5].tolist() == expected
    assert expected[:3] == [1.0, 0.0, 1.0]  # tied: the first class; NaN: the NaN's class
    assert math.isnan(hits[5]) and math.isnan(losses[5])  # an ignored sample
    assert [losses[i].item() for i in (0, 1, 3, 4)] == [-log_probs[i, target[i]].item() for i in (0, 1, 3, 4)]
    assert math.isnan(losses[2])  # the NaN is the target's entry


@pytest.mark.parametrize(("center", "radius"), [(0.0, 0.995), (0.5, 0.4975)])
def test_saturated_count_matches_elementwise_bounds(center, radius):
    t = torch.rand(40, 9) * 2 - 1 + center
    expected = sum(1 for v in t.flatten().tolist() if abs(v - center) >= radius)
    assert stats.saturated_count(t, center, radius).item() == expected


def test_largest_magnitudes_distinguish_underflow_and_overflow_from_zero_and_non_finite():
    tensors = [
        torch.zeros(5),
        torch.full((5,), 1e-30),  # its L2 norm underflows to 0
        torch.full((5,), 1e30),  # its L2 norm overflows to inf
        torch.tensor([1.0, float("nan")]),
        torch.tensor([-3.0, 2.0], dtype=torch.float64),
    ]
    assert [stats.norms([t])[0].item() for t in tensors[:3]] == [0.0, 0.0, math.inf]
    top = stats.largest_magnitudes(tensors)
    assert top[0] == 0.0 and top[1] == pytest.approx(1e-30) and top[2] == pytest.approx(1e30)
    assert math.isnan(top[3]) and top[4] == 3.0


def test_largest_magnitudes_of_complex_tensors_read_their_moduli_imaginary_parts_included(recwarn):
    real = torch.tensor([3.0, 0.0])
    tensors = [
        torch.complex(real, torch.tensor([4.0, 0.0])),  # |3+4i| = 5
        torch.complex(real, torch.tensor([0.0, math.inf])),  # inf in the imaginary part alone
        torch.complex(real, torch.tensor([0.0, math.nan])),
        torch.zeros(3, dtype=torch.cfloat),
    ]
    top = stats.largest_magnitudes(tensors)
    assert top[0] == pytest.approx(5.0) and top[1] == math.inf and math.isnan(top[2]) and top[3] == 0.0
    assert not recwarn.list  # torch warns when a complex tensor is cast to real: nothing was


def test_to_host_moves_values_in_order():
    values = [torch.tensor(1.5), torch.tensor(2, dtype=torch.int64), torch.tensor(-3.0, dtype=torch.float64)]
    assert stats.to_host(values) == [1.5, 2.0, -3.0]


def test_first_tensor_finds_the_first_float_tensor_in_nested_outputs():
    a, b = torch.ones(1), torch.zeros(2)
    assert stats.first_tensor(a) is a
    assert stats.first_tensor((torch.tensor([1]), [b, a])) is b
    assert stats.first_tensor({"mask": torch.tensor([True]), "x": a}) is a
    assert stats.first_tensor(None) is None
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(2, 3, 4), [3, 2], batch_first=True)
    assert stats.first_tensor(packed) is packed.data


def test_tensor_arguments_are_the_plain_tensors_of_a_call_in_order_at_most_so_many():
    x, h, ids = torch.ones(2), torch.zeros(3), torch.tensor([1, 2])

    class Tagged(torch.Tensor):  # a subclass: its values are not read directly
        pass

    tagged = torch.ones(1).as_subclass(Tagged)
    weight = nn.Parameter(torch.ones(1))
    assert stats.tensor_arguments((x, h)) == [x, h]  # a layer's call: its tensors, as they were given
    assert stats.tensor_arguments((x, weight, ids)) == [x, weight, ids]
    assert stats.tensor_arguments((x, h), most=1) == [x]
    assert stats.tensor_arguments(()) == []
    assert stats.tensor_arguments((tagged, x)) == [x]  # a subclass is passed over, not counted
    assert stats.tensor_arguments((x, 3, None, h)) == [x, h]
    assert stats.tensor_arguments(((x, [h]), {"ids": ids})) == [x, h, ids]  # nested, in order
    assert stats.tensor_arguments((x,), {"mask": h}) == [x, h]  # keyword arguments after the positional ones
    assert stats.tensor_arguments((x,), {"mask": h}, most=1) == [x]


@pytest.mark.parametrize("ignore", [-100, -1, 0, 4])
def test_label_counts_put_every_index_outside_the_classes_in_the_last_bin_and_leave_ignore_out(ignore):
    target = torch.tensor([[0, 1, 1, -1, 4, 5, 9, -3], [3, 3, 3, 0, -100, 2, 6, -1]])
    counts = stats.label_counts(target, 5, ignore).tolist()
    flat = [v for v in target.reshape(-1).tolist() if v != ignore]
    assert counts == [float(flat.count(c)) for c in range(5)] + [float(sum(1 for v in flat if not 0 <= v < 5))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_the_loss_s_pull_on_the_output_is_the_sum_of_its_gradient_s_magnitudes(dtype):
    """``all_norms`` files the loss gradient's L1 norm (``target_grad_sum``): the sum of |d(loss)/d(output)| in float32
    or wider, a half-precision gradient summed in float32 (its own sum would overflow at 65504)."""
    from neuraldbg.capture.measure import all_norms
    from neuraldbg.capture.pending import Pending

    g = torch.Generator().manual_seed(4)
    grad = (torch.randn(16, 32, 100, generator=g) * 30).to(dtype)
    pending = Pending(0, True)
    all_norms(pending, {}, [], grad)
    filed = dict(zip([t[0] for t in pending.targets], pending.tensors))
    want = grad.double().abs().sum().item()
    assert want > 65504  # beyond float16
    assert filed["target_grad_sum"].dtype == torch.float32
    assert filed["target_grad_sum"].item() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("size", [7, stats.MAGNITUDE_APART + 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_a_tensor_s_largest_magnitude_nonzero_and_nan_tests_agree_with_plain_torch(size, dtype):
    """``largest_magnitude``, ``any_nonzero`` and ``has_nan`` (the largest and smallest values of a large real
    tensor, plain torch's reductions for a small one) give what ``vector_norm(inf)``, ``any`` and ``isnan().any()``
    give: for all zeros and signed zeros, a NaN, an inf, a -inf, all negative values, and random values."""
    g = torch.Generator().manual_seed(6)
    cases = [torch.zeros(size), -torch.zeros(size), torch.randn(size, generator=g), -torch.rand(size, generator=g) - 1]
    for value in (float("nan"), float("inf"), -float("inf"), -3.0):
        t = torch.zeros(size)
        t[size // 2] = value
        cases.append(t)
    for t in (c.to(dtype) for c in cases):
        want = torch.linalg.vector_norm(t, math.inf)
        got = stats.largest_magnitude(t)
        assert got.dtype == want.dtype and got.shape == ()
        assert (math.isnan(got.item()) and math.isnan(want.item())) or got.item() == want.item()
        assert stats.any_nonzero(t) == bool(t.any())
        assert bool(stats.has_nan(t)) == bool(torch.isnan(t).any())


def test_integer_and_complex_tensors_take_plain_torch_s_way():
    ints = torch.tensor([0, -5, 3] * 2000)
    assert stats.largest_magnitude(ints).item() == 5 and stats.any_nonzero(ints) and not stats.has_nan(ints)
    z = torch.zeros(stats.MAGNITUDE_APART, dtype=torch.complex64)
    z[3] = 3 + 4j
    assert stats.largest_magnitude(z).item() == 5.0 and stats.any_nonzero(z)
