"""``neuraldbg explain DIR``: a folder of separate runs is explained run by run, even where a run's name holds
"rank_2"; only what a distributed run writes (``meta.rank``, a name like ``run.rank1.json``) makes a job."""

from __future__ import annotations

from pathlib import Path

import pytest
from job_support import rank_run, save_rank_trace

import neuraldbg
from neuraldbg import NeuralDbg, TraceError
from neuraldbg.cli import main
from neuraldbg.distributed.merge import merge_traces, stated_rank


@pytest.fixture(scope="module")
def healthy_run() -> NeuralDbg:
    return rank_run(0, dead=False)


def test_a_report_folder_with_a_test_named_low_rank_2_is_explained_run_by_run(
    healthy_run: NeuralDbg, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    healthy_run.save(tmp_path / "test_lora_runs.py_test_low_rank_2.json")
    healthy_run.save(tmp_path / "test_lora_runs.py_test_full_model.json")
    assert main(["explain", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("=== ") == 2 and "NeuralDBG job" not in out
    assert f"=== {tmp_path / 'test_lora_runs.py_test_low_rank_2.json'}" in out


@pytest.mark.parametrize("name", ["test_low_rank_2.json", "trace_rank_1.json", "RANK-1.json", "rank1-notes.json"])
def test_a_lone_run_whose_name_merely_holds_a_rank_is_no_job_with_missing_ranks(
    healthy_run: NeuralDbg, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
):
    healthy_run.save(tmp_path / name)
    assert main(["explain", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "NOT VERIFIED" not in out and "NeuralDBG: healthy" in out


@pytest.mark.parametrize(
    ("name", "meta", "rank"),
    [
        ("run.rank1.json", {}, 1),  # the name the distributed examples give a rank's trace
        ("rank3.json", {}, 3),
        ("test_low_rank_2.json", {}, None),
        ("trace_rank_12.json", {}, None),
        ("run.rank1.json", {"rank": 0, "world_size": 2}, 0),  # what the run recorded wins
        ("anything.json", {"rank": 4, "world_size": 8}, 4),
    ],
)
def test_a_trace_states_its_rank_by_its_meta_or_by_the_writers_name(
    healthy_run: NeuralDbg, tmp_path: Path, name: str, meta: dict[str, int], rank: int | None
):
    trace = neuraldbg.load(save_rank_trace(healthy_run, tmp_path / name, **meta))
    assert stated_rank(trace) == rank


def test_traces_that_record_their_rank_still_merge_whatever_their_names(
    healthy_run: NeuralDbg, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    save_rank_trace(healthy_run, tmp_path / "first.json", rank=0, world_size=2)
    save_rank_trace(healthy_run, tmp_path / "second.json", rank=1, world_size=2)
    assert main(["explain", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("NeuralDBG job: healthy - no training failure on any of the 2 ranks.")


def test_a_run_named_like_rank_2_among_a_jobs_traces_is_named_as_not_a_rank(healthy_run: NeuralDbg, tmp_path: Path):
    job = [
        neuraldbg.load(save_rank_trace(healthy_run, tmp_path / f"run.rank{r}.json", rank=r, world_size=2))
        for r in (0, 1)
    ]
    stray = neuraldbg.load(save_rank_trace(healthy_run, tmp_path / "test_low_rank_2.json"))
    with pytest.raises(TraceError, match=r"test_low_rank_2\.json: cannot tell which rank wrote this trace"):
        merge_traces([*job, stray])
