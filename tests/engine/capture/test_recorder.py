"""Oracle tests: what the recorder files for each step of a real run against a brute-force torch computation."""

from __future__ import annotations

import math

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.stats import tensors as stats
from neuraldbg.stats.step import StepData

# --------------------------------------------------------------------------------------------- recorder


class Capture:
    def __init__(self) -> None:
        self.records: list[StepData] = []

    def __call__(self, records: list[StepData]) -> None:
        self.records.extend(records)


def test_recorded_step_statistics_equal_a_brute_force_recomputation():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
    with torch.no_grad():
        model[0].bias[:5] = -50.0  # five dead units in the ReLU
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = NeuralDbg(model, preset="full")
    capture = Capture()
    dbg._recorder._sink = capture  # observe the raw records instead of the detectors
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(32, 8, generator=g) for _ in range(3)]
    ys = [torch.randn(32, 1, generator=g) for _ in range(3)]

    expected = []
    with dbg:
        for x, y in zip(xs, ys, strict=True):
            outs: dict[str, torch.Tensor] = {}
            handles = [
                m.register_forward_hook(lambda m, i, o, n=n, outs=outs: outs.__setitem__(n, o.detach().clone()))
                for n, m in model.named_children()
            ]
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            for h in handles:
                h.remove()
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            opt.step()
            after = {n: p.detach().clone() for n, p in model.named_parameters()}
            expected.append((x, outs, grads, before, after))
    assert len(capture.records) == 3
    for record, (x, outs, grads, before, after) in zip(capture.records, expected, strict=True):
        assert record.full
        assert record.input_norm == pytest.approx(x.norm().item(), rel=1e-5)
        assert record.output_norm == pytest.approx(outs["4"].norm().item(), rel=1e-5)
        for name, out in outs.items():
            assert record.act[(name, 0)] == pytest.approx(out.norm().item(), rel=1e-5, abs=1e-12)
            assert record.numel[(name, 0)] == out.numel()
        dead, units = record.dead[("1", 0)]
        assert units == 16 and dead == sum(1 for u in range(16) if not bool((outs["1"][:, u] > 0).any()))
        saturated, total = record.saturated[("3", 0)]
        assert total == outs["3"].numel()
        assert saturated == int((outs["3"].abs() >= record_bound(dbg)).sum())
        for name, grad in grads.items():
            assert record.grad[name] == pytest.approx(grad.norm().item(), rel=1e-5)
        for name in grads:
            delta, weight = record.update[name]
            assert delta == pytest.approx((after[name] - before[name]).norm().item(), rel=1e-4)
            assert weight == pytest.approx(after[name].norm().item(), rel=1e-5)
        assert set(record.act) == {(name, 0) for name in outs}


def record_bound(dbg: NeuralDbg) -> float:
    bound = dbg._infos["3"].bound
    assert bound is not None
    return bound.radius


def test_gradients_that_underflow_the_norm_are_not_reported_as_exact_zeros():
    model = nn.Linear(4, 1)
    dbg = NeuralDbg(model, preset="full")
    capture = Capture()
    dbg._recorder._sink = capture
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with dbg:
        opt.zero_grad()
        (model(torch.ones(2, 4)).sum() * 1e-30).backward()  # gradients ~1e-30: squares underflow float32
        opt.step()
    record = capture.records[0]
    assert record.grad_exact_zero == set()
    assert 0 < record.grad["weight"] <= 1e-29


def test_layer_order_is_the_forward_execution_order_not_the_definition_order():
    class Backwards(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.last = nn.Linear(4, 1)
            self.first = nn.Linear(3, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.last(torch.relu(self.first(x)))

    model = Backwards()
    dbg, _ = support.train(model, lambda s: (torch.randn(8, 3), torch.randn(8, 1)), steps=2)
    assert dbg.layers == ["first", "last"]


def test_a_snapshot_estimates_large_updates_from_a_sample_and_sees_every_frozen_parameter():
    g = torch.Generator().manual_seed(0)
    big = torch.randn(1024, 512, generator=g)  # 524k elements: sampled
    small = torch.randn(300, generator=g)  # copied whole
    frozen = torch.randn(1024, 512, generator=g)
    sparse = torch.randn(1024, 512, generator=g)
    before = [t.clone() for t in (big, small, frozen, sparse)]
    snap = stats.Snapshot(["big", "small", "frozen", "sparse"], [big, small, frozen, sparse])
    big.add_(torch.randn(1024, 512, generator=g) * 1e-3)
    small.add_(1e-4)
    sparse[7, 3] += 0.5  # one element: the strided sample misses it
    deltas, after, old = snap.changes()
    d_big, d_small, d_frozen, d_sparse = (
        stats.update_norm(d.item(), s, a.item(), b.item()) for d, s, a, b in zip(deltas, snap.scales, after, old)
    )
    assert [b.item() for b in old] == pytest.approx([t.norm().item() for t in before], rel=1e-6)  # every old norm
    assert snap.scales[0] > 1 and snap.scales[1] == 1.0  # the big one was sampled
    assert d_big == pytest.approx((big - before[0]).norm().item(), rel=0.02)
    assert after[0].item() == pytest.approx(big.norm().item(), rel=1e-6)
    assert d_small == pytest.approx((small - before[1]).norm().item(), rel=1e-4)
    assert d_frozen == 0.0
    assert 0.0 < d_sparse <= 0.5  # a lower bound, never "unchanged"


@pytest.mark.parametrize("shape", [(32, 1), (8, 8), (3, 5, 2), (200, 3)])
def test_host_norm_matches_vector_norm_and_propagates_non_finite_values(shape):
    t = torch.randn(*shape) * 1e3
    assert stats.host_norm(t) == pytest.approx(torch.linalg.vector_norm(t.double()).item(), rel=1e-6)
    strided = torch.randn(*shape, 2)[..., 0]  # a non-contiguous view
    assert not strided.is_contiguous()
    assert stats.host_norm(strided) == pytest.approx(stats.host_norm(strided.contiguous()), rel=1e-6)
    t.view(-1)[3] = float("nan")
    assert math.isnan(stats.host_norm(t))
    t.view(-1)[3] = float("inf")
    assert stats.host_norm(t) == math.inf


def test_dense_gives_a_tensor_with_the_same_norm_or_none_when_values_cannot_be_read():
    indices = torch.tensor([[0, 0, 2], [1, 1, 0]])  # (0, 1) appears twice: coalescing sums it
    coo = torch.sparse_coo_tensor(indices, torch.tensor([3.0, 4.0, 12.0]), (3, 2))
    assert stats.dense(coo).norm().item() == pytest.approx(coo.to_dense().norm().item())
    csr = torch.randn(4, 5).relu().to_sparse_csr()
    assert stats.dense(csr).norm().item() == pytest.approx(csr.to_dense().norm().item())
    quantized = torch.quantize_per_tensor(torch.randn(16), scale=0.1, zero_point=0, dtype=torch.qint8)
    assert stats.dense(quantized).norm().item() == pytest.approx(quantized.dequantize().norm().item())
    plain = torch.randn(3)
    assert stats.dense(plain) is plain and stats.dense(nn.Parameter(plain)) is not None
    assert stats.dense(torch.empty(3, device="meta")) is None


@pytest.mark.parametrize("shape", [(12,), ()])
def test_dead_units_of_an_output_without_a_batch_dimension_count_elements(shape):
    t = torch.tensor([0.0, -1.0, 2.0, 0.0, 3.0, -5.0, 1.0, 0.0, 0.0, 4.0, -2.0, 7.0]).reshape(shape or (12,))
    if not shape:
        t = t[2]  # a scalar: one unit, alive
    dead = stats.dead_units(t, False, 0.0).item()
    units = stats.unit_count(t, False)
    assert units == t.numel()
    assert dead == int((t <= 0).sum())
    assert 0 <= dead <= units


def test_a_cpu_step_lets_go_of_its_tensors_when_committed_and_files_the_same_values():
    """Held until the flush (up to 64 steps), each cheap step's few small tensors pinned the allocator's heap between
    the training's large allocations: an 8x512 MLP faulted in hundreds of pages a step. On a CPU a committed step is
    read at once; its record still waits for the flush, with the values the loop computed."""
    torch.manual_seed(0)
    model = support.tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = NeuralDbg(model)
    capture = Capture()
    dbg._recorder._sink = capture
    with dbg:  # the first 16 steps and step 32 fully observed, the others cheap
        losses, _ = support._steps(model, support.regression_batches(in_features=10), F.mse_loss, 40, opt)
        held = list(dbg._recorder.buffer)
        assert held and not any(part.data.full for part in held)  # committed cheap steps waiting for the flush
        assert all(not part.tensors and not part.vectors and part.captured is None for part in held)
        assert all(part.data.loss is not None for part in held)  # ... already read
    cheap = [r for r in capture.records if not r.full]
    assert len(cheap) > 10
    for record in cheap:
        assert record.loss == pytest.approx(losses[record.step], rel=1e-6)
        assert record.sample_count == 32  # the batch's fingerprints, read at the commit too


def test_steps_on_the_device_path_keep_their_tensors_for_the_flush():
    """Where a read costs a device sync (here the device path taken on a CPU), nothing is read before the flush."""
    model = support.tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = NeuralDbg(model)
    dbg._recorder.host_reads_are_free = False
    with dbg:
        support._steps(model, support.regression_batches(in_features=10), F.mse_loss, 20, opt)
        held = list(dbg._recorder.buffer)
        assert held and all(part.tensors and part.data.loss is None for part in held)
