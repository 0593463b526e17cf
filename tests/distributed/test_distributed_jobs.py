"""One diagnosis for a job of two CPU processes (gloo): DDP, FSDP1 and FSDP2, healthy and broken, a data shard
with a NaN, and a rank that is late. Every scenario runs in one spawn of two ranks (to keep the wall time of the
suite modest); ground truth is taken on the ranks with plain torch (forward hooks of our own, the batches
themselves, DTensor's own ``full_tensor()`` for whole gradients) and checked here.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from neuraldbg import NeuralDbg, cli, load
from neuraldbg.distributed.gather import default_store
from neuraldbg.distributed.merge import merge_traces
from pytest_neuraldbg.distributed import spawn

NAN_STEP = 12
STEPS = 24
LATE_TIMEOUT = 0.5  # rank 0's wait in the late-rank scenario; rank 1 leaves its block only after rank 0 gave up
GATHERED = "tests/late-rank/rank-0-gathered"  # store key: rank 0 has left its block (and its wait) in that scenario
SCENARIOS = [
    ("ddp", "healthy"),
    ("ddp", "dead"),
    ("ddp", "nan"),
    ("fsdp", "healthy"),
    ("fsdp", "dead"),
    ("fully_shard", "healthy"),
    ("fully_shard", "dead"),
    ("none", "late"),
    ("none", "raises"),
    ("ddp", "on_demand"),
]


def make_model(dead: bool) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    if dead:
        with torch.no_grad():
            model[2].bias.fill_(-10.0)
    return model


def wrap(model: nn.Module, how: str) -> nn.Module:
    if how == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    if how == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(model, device_id=torch.device("cpu"))
    if how == "fully_shard":
        from torch.distributed.fsdp import fully_shard

        for layer in (model[0], model[2], model[4]):
            fully_shard(layer)
        fully_shard(model)
    return model


def run_scenario(rank: int, how: str, case: str, out_dir: str) -> dict:
    """Train one scenario on this rank; return the plain-torch truth, this rank's view and rank 0's job."""
    model = make_model(dead=case == "dead")
    relu = model[3]
    relu_max = [-math.inf]
    relu.register_forward_hook(lambda m, i, o: relu_max.__setitem__(0, max(relu_max[0], float(o.detach().max()))))
    wrapped = wrap(model, how)
    torch_names = [n for n, _ in wrapped.named_modules()]
    opt = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(100 + rank)
    truth: dict = {"torch_names": torch_names, "non_finite_batches": [], "whole_grad_norms": {}, "held": {}}
    timeout = LATE_TIMEOUT if case == "late" else 60.0
    dbg = NeuralDbg(wrapped, preset="full", gather_timeout=timeout, gather=case != "on_demand")
    try:
        train_under(dbg, rank, how, case, model, wrapped, opt, g, truth)
    except RuntimeError as exc:
        assert case == "raises" and rank == 1, exc
    truth["job_before_gather"] = dbg.job is not None
    if case == "late" and rank == 0:
        default_store().set(GATHERED, b"1")  # rank 1 may leave its block now
    if case == "on_demand":
        dbg.gather(timeout=30)
    truth["relu_max"] = relu_max[0]
    return report(dbg, rank, f"{how}-{case}", out_dir, truth)


def train_under(dbg, rank, how, case, model, wrapped, opt, g, truth):
    with dbg:
        for step in range(STEPS):
            x = torch.randn(16, 8, generator=g)
            y = x[:, :1] - x[:, 1:2]
            if case == "nan" and rank == 1 and step == NAN_STEP:
                x[5, 3] = float("nan")
            if not torch.isfinite(x).all():
                truth["non_finite_batches"].append(step)
            opt.zero_grad()
            nn.functional.mse_loss(wrapped(x), y).backward()
            if how == "fully_shard" and step < 4:  # the whole gradient of each sharded layer (a collective)
                truth["whole_grad_norms"][step] = {
                    str(i): math.sqrt(sum(float(p.grad.full_tensor().norm()) ** 2 for p in model[i].parameters()))
                    for i in (0, 2, 4)
                }
                truth["held"] = {str(i): model[i].weight.to_local().numel() for i in (0, 2, 4)}
            opt.step()
            if case == "raises" and rank == 1 and step == 10:
                raise RuntimeError("rank 1's loop broke at step 10")
        if case == "late" and rank == 1:  # late by construction: not before rank 0 has stopped waiting for it
            default_store().wait([GATHERED])
            truth["left_after_rank_0_gathered"] = True


def report(dbg: NeuralDbg, rank: int, name: str, out_dir: str, truth: dict) -> dict:
    dbg.save(os.path.join(out_dir, name, f"run.rank{rank}.json"))
    own = {
        "hypotheses": [
            [h.kind.value, h.root.layer, h.root.event_type.value, h.root.step_start] for h in dbg.hypotheses()
        ],
        "meta": {k: dbg.meta.get(k) for k in ("rank", "world_size", "backend", "model")},
        "grad_norms": {
            layer: dict(dbg.history.get("grad_norm", layer).points()) if dbg.history.get("grad_norm", layer) else {}
            for layer in ("0", "2", "4")
        },
    }
    job = None
    if dbg.job is not None:
        job = {
            "hypotheses": [
                {
                    "kind": h.kind.value,
                    "layer": h.root.layer,
                    "event_type": h.root.event_type.value,
                    "step": h.root.step_start,
                    "explanation": h.explanation,
                    "chain": [[e.kind.value if e.kind else None, e.layer] for e in h.chain],
                }
                for h in dbg.job.hypotheses()
            ],
            "merged": dbg.job.job.to_dict(),
            "mermaid": dbg.job.export_mermaid_causal_graph(),
            "report": dbg.job.report(),
        }
    return {"truth": truth, "own": own, "job": job}


def scenarios(rank: int, world_size: int, out_dir: str) -> dict:
    results = {}
    for how, case in SCENARIOS:
        results[f"{how}-{case}"] = run_scenario(rank, how, case, out_dir)
        dist.barrier()  # the next scenario starts together (the late rank has caught up)
    return results


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("jobs"))
    outcomes = spawn(scenarios, out_dir, world_size=2, timeout=420)
    for outcome in outcomes:
        assert outcome.ok, outcome.describe() + "\n" + outcome.error
    ranks = [o.result for o in outcomes]
    return {"ranks": ranks, "dir": out_dir}


def of(jobs: dict, name: str) -> tuple[dict, dict, dict]:
    r0, r1 = jobs["ranks"][0][name], jobs["ranks"][1][name]
    return r0, r1, r0["job"]


# --- healthy jobs are silent, on each rank and merged --------------------------------------------------------


@pytest.mark.parametrize("how", ["ddp", "fsdp", "fully_shard"])
def test_a_healthy_job_is_silent_on_every_rank_and_merged(jobs, how):
    r0, r1, job = of(jobs, f"{how}-healthy")
    assert r0["own"]["hypotheses"] == r1["own"]["hypotheses"] == []
    assert job["hypotheses"] == []
    assert job["merged"]["healthy"] and job["merged"]["verified"]
    assert r1["job"] is None  # the job's diagnosis lives on rank 0


@pytest.mark.parametrize("how", ["ddp", "fsdp", "fully_shard"])
def test_ranks_record_their_rank_world_size_and_backend(jobs, how):
    for rank, result in enumerate(of(jobs, f"{how}-healthy")[:2]):
        assert result["own"]["meta"] == {"rank": rank, "world_size": 2, "backend": "gloo", "model": "Sequential"}


# --- a dead layer on every rank: one hypothesis, under the user's name --------------------------------------


@pytest.mark.parametrize("how", ["ddp", "fsdp", "fully_shard"])
def test_a_layer_dead_on_every_rank_is_one_hypothesis_on_all_ranks_under_the_users_name(jobs, how):
    r0, r1, job = of(jobs, f"{how}-dead")
    assert r0["truth"]["relu_max"] <= 0 and r1["truth"]["relu_max"] <= 0  # '3' never positive, on both ranks
    wrapper_prefix = {"ddp": "module.", "fsdp": "_fsdp_wrapped_module.", "fully_shard": ""}[how]
    assert f"{wrapper_prefix}3" in r0["truth"]["torch_names"]
    (hypothesis,) = job["hypotheses"]
    assert (hypothesis["kind"], hypothesis["layer"]) == ("dead_neurons", "3")
    assert hypothesis["explanation"].startswith("dead_neurons at '3' from step 0 on all ranks.")
    assert ["vanishing_gradients", "0"] in hypothesis["chain"]  # its victims upstream, found per layer
    for result in (r0, r1):
        assert [h[:2] for h in result["own"]["hypotheses"]] == [["dead_neurons", "3"]]  # no wrapper event
    assert "module" not in job["mermaid"]


# --- a NaN in one rank's data shard -------------------------------------------------------------------------


def test_a_nan_in_rank_1s_shard_is_rooted_at_its_input_batch_on_rank_1_only(jobs):
    r0, r1, job = of(jobs, "ddp-nan")
    assert r1["truth"]["non_finite_batches"] == [NAN_STEP] and r0["truth"]["non_finite_batches"] == []
    first = job["hypotheses"][0]
    assert (first["kind"], first["event_type"], first["step"]) == ("non_finite", "input", NAN_STEP)
    assert first["explanation"].startswith(f"non_finite: the input batch at step {NAN_STEP} on rank 1 only")
    assert "a data shard problem" in first["explanation"]
    # rank 0's gradients turned non-finite through DDP's all-reduce: an effect in its chain, not a second fault
    assert len(job["hypotheses"]) == 1
    assert first["chain"] == [["non_finite", ""], ["non_finite", "4"]]
    assert first["explanation"].endswith(
        "reached the other ranks in the same step: non_finite at '4' from step 12 on rank 0 only."
    )
    assert r0["own"]["hypotheses"][0][:2] == ["non_finite", "4"]  # what rank 0 alone concluded
    assert r1["own"]["hypotheses"][0] == ["non_finite", "", "input", NAN_STEP]


# --- sharded parameters --------------------------------------------------------------------------------------


def test_fsdp2_gradient_norms_scale_each_ranks_shard_to_the_whole_parameter(jobs):
    r0, r1, _ = of(jobs, "fully_shard-healthy")
    truth = r0["truth"]
    assert truth["held"]["0"] == r1["truth"]["held"]["0"] == 16 * 8  # '0.weight' split evenly over the ranks
    for step, whole in truth["whole_grad_norms"].items():
        for layer in ("0", "2"):
            # each rank's estimate is its shard's norm times sqrt(2): over an even split, their mean square is
            # exactly the whole's square
            e0, e1 = r0["own"]["grad_norms"][layer][step], r1["own"]["grad_norms"][layer][step]
            assert math.sqrt((e0 * e0 + e1 * e1) / 2) == pytest.approx(whole[layer], rel=1e-5), (layer, step)
            assert whole[layer] / 2 < min(e0, e1) <= max(e0, e1) < whole[layer] * 2
        assert r0["own"]["grad_norms"]["4"][step] == pytest.approx(whole["4"], rel=1e-5)  # rank 0 holds all of it


def test_a_rank_holding_no_element_of_a_layer_does_not_read_it_as_a_zero_gradient(jobs):
    r0, r1, _ = of(jobs, "fully_shard-healthy")
    assert r1["truth"]["held"]["4"] == 0 and r0["truth"]["held"]["4"] > 0  # '4.weight' has one row: rank 0's
    assert r1["own"]["grad_norms"]["4"] == {}
    assert r0["own"]["grad_norms"]["4"]
    assert r1["own"]["hypotheses"] == []


# --- a rank that does not answer in time ---------------------------------------------------------------------


def test_a_rank_that_is_late_is_named_missing_and_does_not_hold_rank_0(jobs):
    _, r1, job = of(jobs, "none-late")
    # rank 1 left its block only once rank 0 had left its own, gathered job in hand: rank 0 did not wait for rank 1
    # (that would have been a deadlock, ended by spawn's timeout); the bound of the wait itself is checked on a fake
    # clock in tests/engine/distributed/test_gather.py
    assert r1["truth"]["left_after_rank_0_gathered"]
    assert job["merged"]["missing"] == {
        "1": f"sent no summary within {LATE_TIMEOUT:g} s (it failed, hung, or left its block later)"
    }
    assert not job["merged"]["verified"] and not job["merged"]["healthy"]
    (hypothesis,) = job["hypotheses"]
    assert hypothesis["kind"] == "incomplete_observation"
    assert "rank 1 sent no summary" in hypothesis["explanation"]


# --- the same, offline, from the traces each rank saved ------------------------------------------------------


def test_neuraldbg_explain_merges_the_saved_traces_of_each_rank(jobs, capsys):
    directory = os.path.join(jobs["dir"], "ddp-dead")
    assert sorted(os.listdir(directory)) == ["run.rank0.json", "run.rank1.json"]
    assert cli.main(["explain", directory]) == 1
    out = capsys.readouterr().out
    assert "dead_neurons at '3' from step 0 on all ranks" in out
    merged = merge_traces([load(os.path.join(directory, f"run.rank{r}.json")) for r in (0, 1)])
    assert [(f.kind.value, f.layer, f.ranks) for f in merged.findings] == [("dead_neurons", "3", (0, 1))]


def test_neuraldbg_explain_names_the_rank_whose_trace_is_missing(jobs, capsys, tmp_path):
    with open(os.path.join(jobs["dir"], "ddp-healthy", "run.rank0.json"), encoding="utf-8") as fh:
        text = fh.read()
    assert json.loads(text)["meta"]["world_size"] == 2
    lone = tmp_path / "job"
    lone.mkdir()
    (lone / "run.rank0.json").write_text(text)
    assert cli.main(["explain", str(lone)]) == 1
    out = capsys.readouterr().out
    assert "NOT VERIFIED" in out and "Rank 1 has no trace" in out


def test_a_rank_that_leaves_its_block_with_an_exception_still_sends_its_findings(jobs):
    job = of(jobs, "none-raises")[2]
    assert job["merged"]["verified"]  # both ranks reported
    assert job["merged"]["ranks"]["1"]["steps_observed"] == 11  # steps 0-10, then the exception
    assert "Rank 1: left its NeuralDbg block with RuntimeError: rank 1's loop broke at step 10" in job["report"]


def test_the_job_can_be_gathered_on_demand_instead_of_at_the_end_of_the_block(jobs):
    r0, r1, job = of(jobs, "ddp-on_demand")
    assert not r0["truth"]["job_before_gather"]  # gather=False: nothing at the end of the block
    assert job["merged"]["verified"] and job["hypotheses"] == []
    assert r1["job"] is None
