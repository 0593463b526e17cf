"""Trace files: a versioned JSON round trip, and clear errors for every kind of bad file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import support
import torch

import neuraldbg
from neuraldbg import FailureKind, TraceError
from neuraldbg.export.trace import event_to_dict


@pytest.fixture(scope="module")
def nan_run() -> neuraldbg.NeuralDbg:
    torch.manual_seed(0)
    model = support.mlp()
    clean = support.regression_batches()

    def batches(step: int) -> support.Batch:
        x, y = clean(step)
        return (x.clone().fill_(float("inf")), y) if step == 9 else (x, y)

    dbg, _ = support.train(model, batches, steps=20)
    return dbg


def test_a_saved_trace_answers_every_query_like_the_live_debugger(nan_run, tmp_path: Path):
    path = nan_run.save(tmp_path / "run.json")
    trace = neuraldbg.load(path)
    assert trace.explain_failure() == nan_run.explain_failure()
    assert [e.layer for e in trace.get_root_causes()] == [e.layer for e in nan_run.get_root_causes()]
    assert [event_to_dict(e) for e in trace.events] == [event_to_dict(e) for e in nan_run.events]  # NaN-safe
    assert trace.layers == nan_run.layers
    assert trace.export_mermaid_causal_graph() == nan_run.export_mermaid_causal_graph()
    assert len(trace.detect_coupled_failures()) == len(nan_run.detect_coupled_failures())
    assert trace.trace_causal_chain("non_finite")[0].step_start == 9
    assert trace.hypotheses()[0].kind is FailureKind.NON_FINITE


def test_the_trace_is_plain_versioned_json_with_what_a_reader_needs(nan_run, tmp_path: Path):
    doc = json.loads(Path(nan_run.save(tmp_path / "run.json")).read_text())
    assert doc["format"] == "neuraldbg-trace" and doc["version"] == 1
    assert doc["meta"]["torch_version"] == torch.__version__
    assert doc["config"]["persistence"] == 3
    assert [layer["name"] for layer in doc["model"]["layers"]][:3] == ["", "0", "1"]
    assert doc["hypotheses"][0]["kind"] == "non_finite"
    assert "inf" in json.dumps(doc["events"])  # non-finite metrics are strings, so the file is strict JSON
    json.loads(Path(tmp_path / "run.json").read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the file is empty"),
        ('{"format": "neuraldbg-trace", "version": 1, "events": [', r"not valid JSON at line 1.*truncated"),
        ("[1, 2]", "expected a JSON object"),
        ('{"format": "other"}', "format: expected 'neuraldbg-trace', got 'other'"),
        ('{"format": "neuraldbg-trace", "version": 7}', "trace version 7 was written by a newer NeuralDBG"),
        ('{"format": "neuraldbg-trace", "version": "1"}', "version: expected int"),
        ('{"format": "neuraldbg-trace", "version": 1}', "events: missing"),
    ],
)
def test_malformed_files_name_the_file_and_the_problem(tmp_path: Path, text: str, message: str):
    path = write(tmp_path, text)
    with pytest.raises(TraceError, match=message) as info:
        neuraldbg.load(path)
    assert str(path) in str(info.value)


def test_a_bad_field_deep_inside_is_reported_with_its_json_path(nan_run, tmp_path: Path):
    doc = nan_run.to_dict()
    doc["events"][1]["step_start"] = "three"
    with pytest.raises(TraceError, match=r"events\[1\]\.step_start: expected int"):
        neuraldbg.load(write(tmp_path, json.dumps(doc)))
    doc = nan_run.to_dict()
    doc["events"][0]["kind"] = "melted_gradients"
    with pytest.raises(TraceError, match=r"events\[0\]\.kind: unknown value 'melted_gradients'"):
        neuraldbg.load(write(tmp_path, json.dumps(doc)))


def test_missing_and_binary_files_are_trace_errors(tmp_path: Path):
    with pytest.raises(TraceError, match="no such trace file"):
        neuraldbg.load(tmp_path / "missing.json")
    (tmp_path / "blob.json").write_bytes(b"\x80\x81\xfe")
    with pytest.raises(TraceError, match="not a text file"):
        neuraldbg.load(tmp_path / "blob.json")
    with pytest.raises(TraceError, match="is a directory"):
        neuraldbg.load(tmp_path)


def test_saving_never_leaves_a_partial_file(nan_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    target = tmp_path / "run.json"
    target.write_text("previous content")

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", fail)
    with pytest.raises(OSError, match="disk full"):
        nan_run.save(target)
    assert target.read_text() == "previous content"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_meta_says_what_ran_where_for_live_and_loaded_runs(nan_run, tmp_path: Path):
    meta = nan_run.meta
    assert meta["model"] == "Sequential" and meta["steps_observed"] == 20 and meta["last_step"] == 19
    assert type(meta["torch_version"]) is str and meta["torch_version"] == str(torch.__version__)
    assert neuraldbg.load(nan_run.save(tmp_path / "t.json")).meta == meta
