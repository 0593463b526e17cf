"""The packed update snapshot files every parameter's norm before the step (the oversized-update check and the
vanishing-gradient check read ``update_before`` for every parameter), reduced as its norm after the step is, so an
untouched parameter reads exactly the same norm twice and its update is exactly 0."""

from __future__ import annotations

import torch

from neuraldbg.capture import measure
from neuraldbg.capture.pending import Pending
from neuraldbg.stats import tensors as stats


def _params() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    # nine small parameters of one shape (packed, copied whole) and one sampled parameter
    return [torch.randn(4, 8, generator=g) for _ in range(9)] + [torch.randn(300, 300, generator=g)]


def test_every_parameter_gets_its_norm_before_the_step_and_untouched_ones_an_exact_zero_update():
    params = _params()
    names = [f"p{i}" for i in range(len(params))]
    plan = stats.SnapshotPlan(names, params)
    assert plan.packed and plan.sampled == [len(params) - 1]
    before = [p.norm().item() for p in params]
    snapshot = plan.take()
    for i in (1, 4, 9):  # the others are left alone (frozen)
        params[i].add_(0.25)
    pending = Pending(0, True)
    measure.updates(pending, snapshot)
    scalars = stats.to_host(pending.tensors)
    vectors = [x for v in pending.vectors for x in v.tolist()]
    pending.file(scalars, vectors)
    data = pending.data
    assert sorted(data.update_before) == sorted(names)  # every parameter, not only the sampled one
    for name, value in zip(names, before):
        assert abs(data.update_before[name] - value) <= 1e-5 * value
    for i, name in enumerate(names):
        delta, after = data.update[name]
        if i in (1, 4, 9):
            assert delta > 0
        else:
            assert delta == 0.0 and after == data.update_before[name]  # no spurious change from two reductions
    assert not data.update_parts
