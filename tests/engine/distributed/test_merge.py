"""One diagnosis for a distributed job: per-rank summaries, merged; built from real saved traces of small runs."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from job_support import POISON_STEP, rank_run, save_rank_trace

import neuraldbg
from neuraldbg import FailureKind, TraceError
from neuraldbg.distributed.merge import (
    MAX_FINDINGS,
    MAX_NAME,
    MAX_TEXT,
    NO_SUMMARY,
    merge,
    merge_traces,
    rank_list,
    stated_rank,
    summarize,
)
from neuraldbg.events import EventType, SemanticEvent
from neuraldbg.reasoning import CausalHypothesis


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks with the same dead layer; rank 1's shard holds a NaN batch. Saved without rank metadata."""
    directory = tmp_path_factory.mktemp("job")
    rank_run(0).save(directory / "run.rank0.json")
    rank_run(1, poison_step=POISON_STEP).save(directory / "run.rank1.json")
    return directory


@pytest.fixture(scope="module")
def traces(job_dir: Path) -> list[neuraldbg.Trace]:
    return [neuraldbg.load(job_dir / "run.rank0.json"), neuraldbg.load(job_dir / "run.rank1.json")]


def test_a_dead_layer_on_both_ranks_is_one_fault_on_all_ranks(traces):
    job = merge_traces(traces)
    dead = [f for f in job.findings if f.kind is FailureKind.DEAD_NEURONS]
    assert len(dead) == 1
    assert dead[0].ranks == (0, 1) and dead[0].on_all_ranks
    assert dead[0].line() == "dead_neurons at '3' from step 0 on all ranks"
    assert dead[0].note() == ""


def test_a_nan_batch_on_one_rank_is_a_data_shard_problem_on_that_rank_only(traces):
    job = merge_traces(traces)
    nan = [f for f in job.findings if f.kind is FailureKind.NON_FINITE]
    assert len(nan) == 1 and nan[0].event_type is EventType.INPUT
    assert nan[0].ranks == (1,) and nan[0].data_shard
    assert nan[0].line() == f"non_finite: the input batch at step {POISON_STEP} on rank 1 only - a data shard problem"
    assert "Only the input batches of rank 1 held non-finite values" in nan[0].note()
    assert nan[0].explained_by == 1 and f"input batch at step {POISON_STEP}" in nan[0].explanation


def test_the_job_report_says_unhealthy_and_lists_each_fault_with_its_ranks(traces):
    job = merge_traces(traces)
    assert not job.healthy and job.verified
    report = job.report()
    assert report.startswith("NeuralDBG job: UNHEALTHY - 2 failures (dead_neurons, non_finite) on a job of 2 ranks.")
    assert "1. dead_neurons at '3' from step 0 on all ranks (confidence 1.00)" in report
    assert f"2. non_finite: the input batch at step {POISON_STEP} on rank 1 only - a data shard problem" in report
    assert "On rank 0: Dead neurons in '3' (ReLU)" in report
    assert "sent no summary" not in report


def test_a_missing_rank_is_named_and_the_job_is_not_verified_healthy(traces):
    healthy = rank_run(0, dead=False)
    job = merge({0: summarize(healthy)}, world_size=2)
    assert job.missing == {1: NO_SUMMARY} and not job.verified and not job.healthy
    assert job.verdict() == "NeuralDBG job: NOT VERIFIED - rank 1 of 2 sent no summary; no failure on rank 0."
    assert "Rank 1 sent no summary (timed out or failed): its findings are unknown." in job.report()
    faulty = merge({0: summarize(traces[0])}, world_size=3, reasons={2: "timed out after 30 s"})
    assert faulty.missing == {1: NO_SUMMARY, 2: "timed out after 30 s"}
    assert faulty.findings[0].line() == "dead_neurons at '3' from step 0 on rank 0, the only rank that reported"
    assert "Rank 2 timed out after 30 s: its findings are unknown." in faulty.report()


def test_a_job_where_every_rank_reports_no_failure_is_verified_healthy():
    summaries = {r: summarize(rank_run(r, dead=False), rank=r, world_size=2) for r in (0, 1)}
    job = merge(summaries, world_size=2)
    assert job.healthy and job.verified and job.findings == []
    assert job.verdict() == "NeuralDBG job: healthy - no training failure on any of the 2 ranks."


def test_a_fault_on_some_ranks_names_them_and_each_ranks_onset(traces):
    base = summarize(traces[0])
    later = json.loads(json.dumps(base))
    later["findings"][0]["step"] = 7
    job = merge({0: base, 2: later, 3: base}, world_size=4)
    finding = job.findings[0]
    assert finding.onsets == {0: 0, 2: 7, 3: 0}
    assert finding.on_ranks() == "on every rank that reported (0, 2, 3)"
    assert finding.onset() == "from step 0 on rank 0, step 7 on rank 2, step 0 on rank 3"
    job = merge({0: base, 2: later, 3: summarize(rank_run(3, dead=False))}, world_size=4)
    assert job.findings[0].on_ranks() == "on ranks 0, 2"
    assert "Only ranks 0, 2 of the 3 ranks that reported show it" in job.findings[0].note()
    job = merge({0: base, 1: summarize(rank_run(1, dead=False))}, world_size=2)
    assert job.findings[0].line() == "dead_neurons at '3' from step 0 on rank 0 only"
    assert job.findings[0].note().startswith("Only rank 0 of 2 shows it. Under data parallelism")


def test_a_nan_batch_on_every_rank_is_a_data_problem_not_a_shard_problem(traces):
    poisoned = summarize(traces[1])
    job = merge({0: poisoned, 1: poisoned}, world_size=2)
    nan = next(f for f in job.findings if f.kind is FailureKind.NON_FINITE)
    assert not nan.data_shard and nan.on_all_ranks
    assert "a data shard problem" not in nan.line()
    assert "the dataset or its preprocessing is at fault, not one shard" in nan.note()


def test_a_malformed_summary_counts_as_missing_with_what_is_wrong(traces):
    good = summarize(traces[0])
    wrong_rank = {**good, "rank": 5}
    bad_step = json.loads(json.dumps(good))
    bad_step["findings"][0]["step"] = -4
    job = merge({0: good, 1: {"format": "something else"}, 2: wrong_rank, 3: bad_step}, world_size=4)
    assert set(job.missing) == {1, 2, 3} and not job.healthy
    assert job.missing[1].startswith("sent a malformed summary (not a neuraldbg-rank-summary")
    assert "it says it comes from rank 5" in job.missing[2]
    assert "out of range" in job.missing[3]


def test_merge_refuses_a_rank_outside_the_job_or_a_bad_world_size(traces):
    summary = summarize(traces[0])
    with pytest.raises(ValueError, match=r"rank 2 is outside range\(2\)"):
        merge({2: summary}, world_size=2)
    with pytest.raises(ValueError, match="world_size must be an integer >= 1, got 0"):
        merge({}, world_size=0)


class ManyFaults:
    """A diagnosis with more findings (and longer explanations) than a summary may carry."""

    meta: ClassVar[dict[str, Any]] = {
        "model": "Big",
        "steps_observed": 10,
        "rank": 3,
        "world_size": 4,
        "backend": "nccl",
    }

    def hypotheses(self) -> list[CausalHypothesis]:
        out = []
        for i in range(MAX_FINDINGS + 8):
            root = SemanticEvent(EventType.UPDATE, FailureKind.FROZEN_PARAMETERS, f"l{i}", None, 0, 9, None, "frozen")
            out.append(CausalHypothesis(FailureKind.FROZEN_PARAMETERS, 0.9, root, [root], "x" * 50_000, "fix"))
        return out


def test_a_summary_is_bounded_json_safe_and_picklable():
    summary = summarize(ManyFaults())  # type: ignore[arg-type]
    assert summary["rank"] == 3 and summary["world_size"] == 4 and summary["backend"] == "nccl"
    assert len(summary["findings"]) == MAX_FINDINGS and summary["findings_left_out"] == 8
    assert all(len(f["explanation"]) <= MAX_TEXT for f in summary["findings"])
    assert len(json.dumps(summary, allow_nan=False)) < 100_000
    assert pickle.loads(pickle.dumps(summary)) == summary
    job = merge({3: summary}, world_size=4)
    assert "Rank 3 had 8 more findings than it could send (32 at most)." in job.report()
    assert len(merge({}, world_size=2, reasons={1: "timed out " * 1000}).missing[1]) == MAX_NAME


def test_the_merged_diagnosis_is_json_with_ranks_onsets_and_missing_ranks(traces):
    job = merge({0: summarize(traces[0]), 1: summarize(traces[1])}, world_size=3)
    payload = json.loads(json.dumps(job.to_dict(), allow_nan=False))
    assert payload["healthy"] is False and payload["verified"] is False
    assert payload["missing"] == {"2": NO_SUMMARY}
    dead = next(f for f in payload["findings"] if f["kind"] == "dead_neurons")
    assert dead["ranks"] == [0, 1] and dead["onsets"] == {"0": 0, "1": 0}
    assert payload["ranks"]["1"]["steps_observed"] == 30


def test_ranks_are_listed_with_runs_as_ranges():
    assert rank_list([3, 0, 1, 2, 5, 7, 8]) == "0-3, 5, 7, 8"
    assert rank_list([1]) == "1"


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("run.rank0.json", 0),
        ("rank3.json", 3),
        ("/data/rank9/run.rank1.json", 1),  # only the file name counts
        ("trace_rank_12.json", None),  # a name that holds a rank is not a rank's trace: the writer's form only
        ("RANK-3.json", None),
        ("frank2.json", None),
        ("rank1-rank2.json", None),
        ("run.json", None),
    ],
)
def test_a_file_name_states_a_rank_only_in_the_form_a_ranks_trace_is_saved(name: str, rank: int | None):
    assert stated_rank(SimpleNamespace(meta={}, source=name)) == rank


def test_meta_rank_wins_over_the_file_name(job_dir: Path, tmp_path: Path):
    a = save_rank_trace(neuraldbg.load(job_dir / "run.rank0.json"), tmp_path / "a.rank0.json", rank=1, world_size=2)
    b = save_rank_trace(neuraldbg.load(job_dir / "run.rank1.json"), tmp_path / "b.rank1.json", rank=0, world_size=2)
    job = merge_traces([neuraldbg.load(a), neuraldbg.load(b)])
    nan = next(f for f in job.findings if f.kind is FailureKind.NON_FINITE)
    assert nan.ranks == (0,)  # b holds the NaN batch and says it is rank 0


def test_traces_that_cannot_be_told_apart_are_refused_with_both_names(job_dir: Path, tmp_path: Path):
    rank0 = neuraldbg.load(job_dir / "run.rank0.json")
    copy = neuraldbg.load(save_rank_trace(rank0, tmp_path / "copy.json", rank=0))
    with pytest.raises(TraceError, match=r"copy\.json: claims rank 0, like .*run\.rank0\.json"):
        merge_traces([rank0, copy])
    nameless = neuraldbg.load(save_rank_trace(rank0, tmp_path / "nameless.json"))
    with pytest.raises(TraceError, match=r"nameless\.json: cannot tell which rank wrote this trace"):
        merge_traces([rank0, nameless])
    two = neuraldbg.load(save_rank_trace(rank0, tmp_path / "two.json", rank=1, world_size=2))
    three = neuraldbg.load(save_rank_trace(rank0, tmp_path / "three.json", rank=2, world_size=3))
    with pytest.raises(TraceError, match=r"three\.json: says the job has 3 ranks, but .*two\.json says 2"):
        merge_traces([two, three])


def test_a_rank_without_a_trace_below_the_job_size_is_missing(job_dir: Path, tmp_path: Path):
    rank1 = neuraldbg.load(save_rank_trace(neuraldbg.load(job_dir / "run.rank1.json"), tmp_path / "r1.json", rank=1))
    job = merge_traces([rank1])  # world size unknown: one more than the highest rank
    assert job.world_size == 2 and job.missing == {0: "has no trace (it failed, or its trace was not saved)"}
