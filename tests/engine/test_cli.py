"""The command line: demo, explain, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import support
from job_support import POISON_STEP, rank_run, save_rank_trace

from neuraldbg import NeuralDbg, Trace
from neuraldbg.cli import main


def test_the_demo_diagnoses_the_broken_model_and_exits_0(capsys: pytest.CaptureFixture[str]):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "NeuralDBG: UNHEALTHY" in out
    assert "Dead neurons in '5' (ReLU), fed by '4' (Linear)" in out
    assert "flowchart TD" in out
    assert "diagnosis as expected" in out


def test_every_demo_is_diagnosed_as_expected(capsys: pytest.CaptureFixture[str]):
    assert main(["demo", "--all", "--no-graph"]) == 0
    assert capsys.readouterr().out.count("diagnosis as expected") == 6


def test_explain_prints_the_report_and_exits_1_on_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["demo", "frozen", "--save", str(tmp_path / "t.json")]) == 0
    capsys.readouterr()
    assert main(["explain", str(tmp_path / "t.json")]) == 1
    assert "Frozen parameters: '0.weight', '0.bias'" in capsys.readouterr().out
    assert main(["explain", str(tmp_path / "t.json"), "--mermaid"]) == 1
    assert capsys.readouterr().out.startswith("flowchart TD")
    assert main(["explain", str(tmp_path / "t.json"), "--json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    assert payload["healthy"] is False
    assert payload["hypotheses"][0]["kind"] == "frozen_parameters"
    assert payload["hypotheses"][0]["layer"] == "0"


def test_explain_exits_0_on_a_healthy_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    dbg, _ = support.train(support.mlp(), support.regression_batches(), steps=10)
    path = dbg.save(tmp_path / "healthy.json")
    assert main(["explain", path]) == 0
    assert "healthy" in capsys.readouterr().out


def test_bad_input_exits_2_with_a_message_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    bad = tmp_path / "broken.json"
    bad.write_text("{")
    assert main(["explain", str(bad)]) == 2
    assert f"{bad}: not valid JSON" in capsys.readouterr().err
    assert main(["demo", "nosuch"]) == 2
    assert "unknown demo 'nosuch'; expected one of: dead," in capsys.readouterr().err
    assert main(["demo", "learning_rate"]) == 2
    assert "unknown demo 'learning_rate' (did you mean 'learning-rate'?); expected one of" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["explain"])
    assert info.value.code == 2


def test_an_internal_error_exits_3_never_1_which_means_failures_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    dbg, _ = support.train(support.mlp(), support.regression_batches(), steps=5)
    path = dbg.save(tmp_path / "t.json")

    def broken(self: object) -> str:
        raise RuntimeError("a bug\nwith two lines")

    monkeypatch.setattr(Trace, "report", broken)
    assert main(["explain", path]) == 3
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        "neuraldbg explain: internal error, a bug in NeuralDBG (please report it with the trace): RuntimeError: a bug"
    )


def test_a_layer_name_that_cannot_be_encoded_is_printed_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["demo", "frozen", "--save", str(tmp_path / "t.json")]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "t.json").read_text())
    doc["events"][0]["layer"] = "lone\ud800surrogate"  # a ModuleDict key may be any str
    doc["events"][0]["param"] = None
    (tmp_path / "t.json").write_text(json.dumps(doc))
    assert main(["explain", str(tmp_path / "t.json")]) == 1
    assert "lone\\ud800surrogate" in capsys.readouterr().out


def test_max_bytes_raises_or_lowers_the_size_cap(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["demo", "frozen", "--save", str(tmp_path / "t.json")]) == 0
    capsys.readouterr()
    size = (tmp_path / "t.json").stat().st_size
    assert main(["explain", str(tmp_path / "t.json"), "--max-bytes", str(size - 1)]) == 2
    assert f"is {size} bytes, more than the {size - 1} a trace may have" in capsys.readouterr().err
    assert main(["explain", str(tmp_path / "t.json"), "--max-bytes", str(size)]) == 1
    with pytest.raises(SystemExit) as info:
        main(["explain", str(tmp_path / "t.json"), "--max-bytes", "0"])
    assert info.value.code == 2


# --- a distributed job's per-rank traces ------------------------------------------------------------------


@pytest.fixture(scope="module")
def job_runs() -> dict[str, NeuralDbg]:
    return {
        "dead0": rank_run(0),
        "dead1_nan": rank_run(1, poison_step=POISON_STEP),
        "healthy0": rank_run(0, dead=False),
        "healthy1": rank_run(1, dead=False),
    }


def test_explain_on_a_directory_merges_the_ranks_and_exits_1_on_failures(
    job_runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    job_runs["dead0"].save(tmp_path / "run.rank0.json")
    job_runs["dead1_nan"].save(tmp_path / "run.rank1.json")
    (tmp_path / ".neuraldbg-partial.json").write_text("{")  # a save interrupted mid-write is not a trace
    assert main(["explain", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("NeuralDBG job: UNHEALTHY - 2 failures (dead_neurons, non_finite) on a job of 2 ranks.")
    assert "dead_neurons at '3' from step 0 on all ranks" in out
    assert f"non_finite: the input batch at step {POISON_STEP} on rank 1 only - a data shard problem" in out
    files = [str(tmp_path / "run.rank0.json"), str(tmp_path / "run.rank1.json")]
    assert main(["explain", *files, "--json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    assert payload["traces"] == files and payload["verified"] is True and payload["healthy"] is False
    assert {f["kind"]: f["ranks"] for f in payload["findings"]} == {"dead_neurons": [0, 1], "non_finite": [1]}


def test_the_merged_graph_shows_which_ranks_show_each_fault_and_renders(
    job_runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    save_rank_trace(job_runs["dead0"], tmp_path / "a.json", rank=0, world_size=3)
    save_rank_trace(job_runs["dead1_nan"], tmp_path / "b.json", rank=1, world_size=3)
    assert main(["explain", str(tmp_path), "--mermaid"]) == 1
    graph = capsys.readouterr().out
    assert graph.splitlines()[7:] == [
        '  n0["ranks 0, 1"]',
        "  n1[\"dead_neurons<br>'3'\"]",
        '  n2["rank 1"]',
        '  n3["non_finite<br>the input batch<br>a data shard problem"]',
        '  n4["rank 2<br>has no trace (it failed, or its trace was not saved)<br>findings unknown"]',
        '  n0 -->|"from step 0"| n1',
        f'  n2 -->|"at step {POISON_STEP}"| n3',
        "  class n0,n2 evidence",
        "  class n1 root",
        "  class n3 critical",
        "  class n4 missing",
    ]
    mermaidx = pytest.importorskip("mermaidx")
    svg = mermaidx.render(graph).svg()
    assert "a data shard problem" in svg and "findings unknown" in svg


def test_a_healthy_job_exits_0_and_a_missing_rank_makes_it_exit_1(
    job_runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    save_rank_trace(job_runs["healthy0"], tmp_path / "run.rank0.json", world_size=2)
    save_rank_trace(job_runs["healthy1"], tmp_path / "run.rank1.json", world_size=2)
    assert main(["explain", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("NeuralDBG job: healthy - no training failure on any of the 2 ranks.")
    (tmp_path / "run.rank1.json").unlink()
    assert main(["explain", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("NeuralDBG job: NOT VERIFIED - rank 1 of 2 sent no summary; no failure on rank 0.")
    assert "Rank 1 has no trace (it failed, or its trace was not saved): its findings are unknown." in out


def test_job_input_errors_exit_2_with_one_line(job_runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["explain", str(empty)]) == 2
    assert capsys.readouterr().err == f"neuraldbg explain: {empty}: no *.json trace in this directory\n"
    job = tmp_path / "job"
    save_rank_trace(job_runs["dead0"], job / "a.rank0.json")
    save_rank_trace(job_runs["healthy0"], job / "b.rank0.json")
    assert main(["explain", str(job)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "b.rank0.json: claims rank 0, like" in err
    (job / "b.rank0.json").write_text("[")
    assert main(["explain", str(job)]) == 2
    assert "b.rank0.json: not valid JSON" in capsys.readouterr().err
