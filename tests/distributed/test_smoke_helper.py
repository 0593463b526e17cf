"""``pytest_neuraldbg.distributed.smoke_train``: a user's smoke test across two gloo processes, gated on the job's
merged diagnosis with the ordinary assertion helpers and recorded like any run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from neuraldbg import FailureKind, load
from pytest_neuraldbg import assert_healthy, assert_no_dead_neurons, records
from pytest_neuraldbg.distributed import DistributedRunError, smoke_train, spawn


def make_model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))


def make_dead_model() -> nn.Sequential:
    model = make_model()
    with torch.no_grad():
        model[2].bias.fill_(-10.0)
    return model


def shard(rank: int, world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(10 + rank)
    batches = []
    for _ in range(6):
        x = torch.randn(32, 16, generator=g)
        batches.append((x, x[:, :1] - x[:, 1:2]))
    return batches


def shard_of_a_broken_rank(rank: int, world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if rank == 1:
        raise ValueError("rank 1 cannot read its shard")
    return shard(rank, world_size)


def test_a_distributed_smoke_test_fails_naming_a_layer_dead_on_all_ranks(tmp_path):
    torch.manual_seed(0)  # what each rank builds after torch.manual_seed(seed=0): the same weights
    initial = make_dead_model()
    with torch.no_grad():
        for rank in (0, 1):  # plain torch: '3' is never positive on either rank's batches
            for x, _ in shard(rank, 2):
                assert float(initial[3](initial[2](initial[1](initial[0](x)))).max()) <= 0
    job = smoke_train(make_dead_model, shard, nn.functional.mse_loss, world_size=2, wrap="ddp", steps=20)
    (hypothesis,) = job.hypotheses()
    assert (hypothesis.kind, hypothesis.root.layer) == (FailureKind.DEAD_NEURONS, "3")
    with pytest.raises(AssertionError, match="dead_neurons at '3' from step 0 on all ranks"):
        assert_no_dead_neurons(job)
    assert job.steps == 20 and job.world_size == 2 and job.job.verified
    # recordable by the plugin's reports like any run, and saved as a trace that loads back
    record = records.summarise(job, nodeid="tests/test_x.py::test_y", run="1", include_trace=True)
    assert record["verdict"] == records.UNHEALTHY and record["steps"] == 20
    assert record["hypotheses"][0]["explanation"].startswith("dead_neurons at '3' from step 0 on all ranks.")
    assert record["trace"]["meta"]["job"]["findings"][0]["ranks"] == [0, 1]
    loaded = load(job.save(tmp_path / "job.json"))  # rank 0's run, with the job's merged findings in its meta
    assert [(h.kind, h.root.layer) for h in loaded.hypotheses()] == [(FailureKind.DEAD_NEURONS, "3")]
    assert loaded.meta["job"]["findings"][0]["line"] == "dead_neurons at '3' from step 0 on all ranks"


def test_a_rank_that_fails_is_named_and_the_job_is_not_verified_healthy():
    job = smoke_train(
        make_model, shard_of_a_broken_rank, nn.functional.mse_loss, wrap="none", steps=10, gather_timeout=2.0
    )
    assert job.missing == {1: "sent no summary within 2 s (it failed, hung, or left its block later)"}
    with pytest.raises(AssertionError, match="rank 1 sent no summary") as failure:
        assert_healthy(job)
    assert "rank 1 cannot read its shard" in job.report()  # the rank's own error, in the job's report
    assert "incomplete_observation" in str(failure.value)


def fails_on_rank_0(rank: int, world_size: int) -> int:
    if rank == 0:
        raise RuntimeError("rank 0 is broken")
    return rank


def test_a_rank_0_that_fails_gives_every_ranks_outcome_instead_of_a_diagnosis():
    with pytest.raises(DistributedRunError, match="rank 0 produced no diagnosis") as failure:
        smoke_train(make_model, shard, nn.functional.mse_loss, wrap=fails_as_a_wrapper, steps=5, timeout=120)
    assert "rank 0 failed: RuntimeError: no wrapper on rank 0" in str(failure.value)
    outcomes = failure.value.outcomes
    assert [o.ok for o in outcomes] == [False, True] and outcomes[1].result == {"steps": 5}
    assert "RuntimeError: no wrapper on rank 0" in outcomes[0].error


def fails_as_a_wrapper(model: nn.Module) -> nn.Module:
    import torch.distributed as dist

    if dist.get_rank() == 0:
        raise RuntimeError("no wrapper on rank 0")
    return model


def test_what_cannot_reach_a_new_process_is_refused_before_any_process_starts():
    with pytest.raises(TypeError, match="must be picklable"):
        spawn(lambda rank, world_size: rank, world_size=2)
    with pytest.raises(ValueError, match="wrap must be one of ddp, fsdp, fully_shard, none"):
        smoke_train(make_model, shard, nn.functional.mse_loss, wrap="horovod")
    with pytest.raises(
        ValueError, match=r"^smoke_train\(\): unknown option 'persistance' \(did you mean 'persistence'"
    ):
        smoke_train(make_model, shard, nn.functional.mse_loss, persistance=3)
    with pytest.raises(ValueError, match=r"^smoke_train\(\): unknown option 'wrapp' \(did you mean 'wrap'\?\)"):
        smoke_train(make_model, shard, nn.functional.mse_loss, wrapp="none")
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        spawn(fails_on_rank_0, world_size=0)
