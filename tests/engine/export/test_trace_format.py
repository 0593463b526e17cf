"""Trace files: a versioned JSON round trip, and clear errors for every kind of bad file."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pytest
import support
import torch

import neuraldbg
from neuraldbg import FailureKind, TraceError
from neuraldbg.export.trace_format import event_to_dict


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
        ("[1, 2]", "top level: expected an object, got array of 2"),
        ('{"format": "other"}', "format: expected 'neuraldbg-trace', got 'other'"),
        ('{"format": "neuraldbg-trace", "version": 7}', "trace version 7 was written by a newer NeuralDBG"),
        (
            '{"format": "neuraldbg-trace", "version": "1"}',
            "version: expected an integer from 1 to 2147483648, got string '1'",
        ),
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
    with pytest.raises(
        TraceError, match=r"events\[1\]\.step_start: expected an integer from 0 to \d+, got string 'three'"
    ):
        neuraldbg.load(write(tmp_path, json.dumps(doc)))
    doc = nan_run.to_dict()
    doc["events"][0]["kind"] = "Melted Gradients!"
    with pytest.raises(TraceError, match=r"events\[0\]\.kind: not a failure kind's name: 'Melted Gradients!'"):
        neuraldbg.load(write(tmp_path, json.dumps(doc)))


def test_a_kind_whose_plugin_is_not_installed_loads_and_is_reported_by_its_name(nan_run, tmp_path: Path):
    doc = nan_run.to_dict()
    for event in doc["events"]:
        if event["kind"] == "non_finite":
            event["kind"] = "melted_gradients"  # written by a plugin this process does not have
    trace = neuraldbg.load(write(tmp_path, json.dumps(doc)))
    kinds = [h.kind.value for h in trace.hypotheses()]
    assert "melted_gradients" in kinds and "non_finite" not in kinds
    assert "Melted gradients in '" in trace.report()  # generic words: the kind's own are the plugin's
    assert "melted_gradients" in trace.export_mermaid_causal_graph()


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


# --- hostile files: what the reader refuses, and how -------------------------------------------------------


def one_line_error(path: Path, **kwargs: object) -> str:
    """Load ``path`` expecting a TraceError; returns its message after checking it is one line naming the file."""
    with pytest.raises(TraceError) as info:
        neuraldbg.load(path, **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    return message


def first_history_series(doc: dict) -> list:
    metric = next(iter(doc["history"]))
    return doc["history"][metric][next(iter(doc["history"][metric]))]


def set_in(doc: dict, where: tuple, value: object) -> None:
    node = doc
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value


TARGETED = [
    (("meta", "last_step"), "abc", r"meta\.last_step: expected an integer from -1 to \d+, got string 'abc'"),
    (("meta", "steps_observed"), -3, r"meta\.steps_observed: expected an integer from 0"),
    (("meta", "compiled"), "yes", r"meta\.compiled: expected true or false, got string 'yes'"),
    (("meta", "rank"), 2, r"meta\.rank: rank 2 is not below meta\.world_size 2"),
    (("config", "persistence"), 0, r"config\.persistence: expected an integer between 1 and 1000, got 0"),
    (("config", "history_points"), "many", r"config\.history_points: expected an integer >= 8"),
    (("model", "order", 0), None, r"model\.order\[0\]: expected a string, got null"),
    (("model", "layers", 1, "numel"), -1, r"model\.layers\[1\]\.numel: expected an integer from 0"),
    (("model", "layers", 1, "name"), 5, r"model\.layers\[1\]\.name: expected a string, got integer 5"),
    (("events", 0, "step_start"), -1, r"events\[0\]\.step_start: expected an integer from 0"),
    (("events", 0, "step_end"), 2**53, r"events\[0\]\.step_end: expected an integer from 0 to 9007199254740991"),
    (("events", 0, "step_start"), 2.0, r"events\[0\]\.step_start: expected an integer from 0 .*got number 2\.0"),
    (("events", 0, "confidence"), 1.5, r"events\[0\]\.confidence: expected a number from 0 to 1, got number 1\.5"),
    (("events", 0, "confidence"), "nan", r"events\[0\]\.confidence: expected a number from 0 to 1"),
    (("events", 0, "layer"), ["0"], r"events\[0\]\.layer: expected a string, got array of 1"),
    (("events", 0, "metrics", "call"), -1, r"events\[0\]\.metrics\.call: expected a finite number from 0"),
    (("events", 0, "metrics", "odd key!"), "lots", r'events\[0\]\.metrics\["odd key!"\]: expected a finite number'),
    (("events", 0, "detail"), 3, r"events\[0\]\.detail: expected a string, got integer 3"),
    (("hypotheses", 0, "root"), 999, r"hypotheses\[0\]\.root: expected the index of an event \(0 to \d+\), got"),
    (("hypotheses", 0, "couplings"), [[0, 1]], r"hypotheses\[0\]\.couplings\[0\]: expected \[cause index, effect"),
    (("hypotheses", 0, "confidence"), -0.1, r"hypotheses\[0\]\.confidence: expected a number from 0 to 1"),
    (("hypotheses", 0, "explanation"), None, r"hypotheses\[0\]\.explanation: expected a string, got null"),
    (("history",), [], r"history: expected an object, got array of 0"),
    (("meta", "world_size"), 0, r"meta\.world_size: expected an integer from 1"),
    (("meta", "backend"), 7, r"meta\.backend: expected a string, got integer 7"),
    (("model", "layers", 1), {"name": "x"}, r"model\.layers\[1\]\.type: missing"),
    (("events", 0, "step_end"), 0, r"events\[0\]\.step_end: step_end 0 is before step_start 9"),
    (("events", 0, "event_type"), "vibes", r"events\[0\]\.event_type: unknown value 'vibes'; expected one of"),
    (("hypotheses", 0, "kind"), "bad luck", r"hypotheses\[0\]\.kind: not a failure kind's name: 'bad luck'"),
    (("hypotheses", 0, "chain", 0), -1, r"hypotheses\[0\]\.chain\[0\]: expected the index of an event"),
]


@pytest.mark.parametrize(("where", "value", "message"), TARGETED, ids=[str(t[0]) for t in TARGETED])
def test_every_field_a_trace_reads_is_checked_and_named_by_its_json_path(
    nan_run, tmp_path: Path, where: tuple, value: object, message: str
):
    doc = json.loads(json.dumps(nan_run.to_dict()))
    doc["meta"]["world_size"] = 2
    set_in(doc, where, value)
    assert re.search(message, one_line_error(write(tmp_path, json.dumps(doc)))), message


def test_a_count_its_kind_reads_must_be_a_finite_count(nan_run, tmp_path: Path):
    doc = json.loads(json.dumps(nan_run.to_dict()))
    doc["events"][0].update(kind="dead_neurons", to_state="dead")
    doc["events"][0]["metrics"]["units"] = "inf"  # the dead units room reads int(units)
    message = r"events\[0\]\.metrics\.units: expected a finite number from 0"
    assert re.search(message, one_line_error(write(tmp_path, json.dumps(doc))))
    doc["events"][0].update(kind="non_finite", to_state="non_finite")  # no room of that kind counts units
    neuraldbg.load(write(tmp_path, json.dumps(doc)))


def test_history_points_must_be_step_value_pairs_with_integer_steps(nan_run, tmp_path: Path):
    for point, message in (
        (["inf", 1], r"history\.\w+\[\"?[^\]]*\"?\]\[0\]\[0\]: expected an integer from 0 .*got string 'inf'"),
        ([3], r"\[0\]: expected a \[step, value\] pair, got array of 1"),
        (5, r"\[0\]: expected a \[step, value\] pair, got integer 5"),
        ([3, "x"], r"\[0\]\[1\]: expected a finite number \(or \"inf\", \"-inf\", \"nan\"\), got string 'x'"),
    ):
        doc = nan_run.to_dict()
        first_history_series(doc)[0] = point
        assert re.search(message, one_line_error(write(tmp_path, json.dumps(doc)))), (point, message)


def test_a_document_nested_100000_deep_is_refused_before_parsing(tmp_path: Path):
    deep = "[" * 100_000 + "]" * 100_000
    path = write(tmp_path, '{"format": "neuraldbg-trace", "version": 1, "events": ' + deep + "}")
    assert "JSON nested 100001 levels deep; a NeuralDBG trace nests at most 64" in one_line_error(path)


def test_the_depth_limit_counts_brackets_outside_strings_only(nan_run, tmp_path: Path):
    doc = nan_run.to_dict()
    doc["meta"]["note"] = "[" * 1000 + '\\"{' * 100  # brackets inside a string are text
    doc["meta"]["nested"] = json.loads("[" * 62 + "]" * 62)  # inside the document and meta: 64 levels in all
    assert neuraldbg.load(write(tmp_path, json.dumps(doc))).meta["note"] == doc["meta"]["note"]
    doc["meta"]["nested"] = json.loads("[" * 63 + "]" * 63)
    assert "JSON nested 65 levels deep" in one_line_error(write(tmp_path, json.dumps(doc)))


def test_a_number_too_long_for_python_to_parse_quickly_is_a_trace_error(nan_run, tmp_path: Path):
    text = json.dumps(nan_run.to_dict())
    long = text.replace('"last_step": 19', '"last_step": ' + "9" * 5000)
    assert "a number with more than 24 digits in a row; no field of a trace holds one" in one_line_error(
        write(tmp_path, long)
    )
    at_limit = text.replace('"last_step": 19', '"last_step": ' + "9" * 24)  # read, then out of range
    assert "meta.last_step: expected an integer from -1" in one_line_error(write(tmp_path, at_limit))
    past_limit = text.replace('"last_step": 19', '"last_step": ' + "9" * 25)
    assert "more than 24 digits in a row" in one_line_error(write(tmp_path, past_limit))


def test_a_trace_at_the_size_cap_loads_and_one_byte_more_is_refused_before_reading(nan_run, tmp_path: Path):
    path = Path(nan_run.save(tmp_path / "run.json"))
    size = path.stat().st_size
    assert neuraldbg.load(path, max_bytes=size).hypotheses()
    assert f"is {size} bytes, more than the {size - 1} a trace may have" in one_line_error(path, max_bytes=size - 1)
    sparse = tmp_path / "huge.json"
    with open(sparse, "wb") as fh:  # 64 MiB + 1 of nothing: refused by its size, never read
        fh.truncate(64 * 1024 * 1024 + 1)
    assert "more than the 67108864 a trace may have" in one_line_error(sparse)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
def test_a_file_whose_size_is_not_known_in_advance_is_read_no_further_than_the_cap():
    path = Path("/proc/self/maps")  # st_size 0, content several kilobytes
    assert "holds more than the 100 bytes a trace may have" in one_line_error(path, max_bytes=100)


def opened_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every path os.open is asked to open from now on."""
    opened: list[str] = []
    real_open = os.open

    def recording_open(path: str, *args: object, **kwargs: object) -> int:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", recording_open)
    return opened


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_opening_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    opened = opened_paths(monkeypatch)
    assert "is a FIFO (named pipe), not a regular file" in one_line_error(fifo)
    assert opened == []


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_symlink_to_an_endless_device_is_refused_before_opening(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    link = tmp_path / "trace.json"
    link.symlink_to("/dev/zero")
    opened = opened_paths(monkeypatch)
    assert "is a character device (through a symbolic link), not a regular file" in one_line_error(link)
    assert opened == []
    dangling = tmp_path / "gone.json"
    dangling.symlink_to(tmp_path / "nothing")
    assert "no such trace file (a symbolic link to nothing)" in one_line_error(dangling)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_swapped_in_after_the_check_is_opened_without_blocking_and_refused(
    nan_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    regular = Path(nan_run.save(tmp_path / "regular.json"))
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: real_stat(regular if str(p) == str(fifo) else p, *a, **k))
    outcome: list[str] = []
    reader = threading.Thread(target=lambda: outcome.append(one_line_error(fifo)), daemon=True)
    reader.start()
    reader.join(60)  # a blocking open would wait for a writer forever: be that writer, then fail the test
    if reader.is_alive():
        with open(fifo, "w"):
            pass
    monkeypatch.undo()
    assert outcome and "is a FIFO (named pipe), not a regular file" in outcome[0]


def test_a_name_with_a_nul_or_a_newline_gives_one_line(tmp_path: Path):
    with pytest.raises(TraceError, match="not a valid file name"):
        neuraldbg.load("a\0b.json")
    with pytest.raises(TraceError) as info:
        neuraldbg.load(str(tmp_path / "two\nlines.json"))
    assert "\n" not in str(info.value) and "no such trace file" in str(info.value)


def test_a_byte_order_mark_is_accepted(nan_run, tmp_path: Path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(nan_run.to_dict()).encode())
    assert neuraldbg.load(path).hypotheses()[0].kind is FailureKind.NON_FINITE


def test_fields_a_later_version_adds_pass_through_meta_and_are_skipped_in_config(nan_run, tmp_path: Path):
    doc = nan_run.to_dict()
    doc["meta"]["gpu"] = {"name": "H200", "count": 8}
    doc["config"]["a_future_threshold"] = 0.25
    trace = neuraldbg.load(write(tmp_path, json.dumps(doc)))
    assert trace.meta["gpu"] == {"name": "H200", "count": 8}
    assert "a_future_threshold" not in trace.config.as_dict()


def test_number_literals_must_be_finite_json(nan_run, tmp_path: Path):
    doc = nan_run.to_dict()
    doc["meta"]["note"] = float("nan")
    assert 'a bare NaN, which is not JSON; NeuralDBG writes non-finite numbers as the strings "inf"' in (
        one_line_error(write(tmp_path, json.dumps(doc)))
    )
    doc["meta"]["note"] = float("-inf")
    assert "a bare -Infinity, which is not JSON" in one_line_error(write(tmp_path, json.dumps(doc)))
    doc["meta"]["note"] = {"sizes": [1, 2, 12345.5]}
    text = json.dumps(doc).replace("12345.5", "1e999")
    assert "meta.note.sizes[2]: a number too large for a float" in one_line_error(write(tmp_path, text))
    doc = nan_run.to_dict()
    doc["events"][0]["metrics"]["grad_norm"] = 12345.5
    text = json.dumps(doc).replace("12345.5", "-1e999")
    assert "events[0].metrics.grad_norm: expected a finite number" in one_line_error(write(tmp_path, text))
    doc = nan_run.to_dict()
    doc["model"]["layers"][0]["extra"] = 12345.5
    text = json.dumps(doc).replace("12345.5", "1e400")
    assert "model.layers[0].extra: a number too large for a float" in one_line_error(write(tmp_path, text))


def test_a_finished_run_whose_events_were_undone_exports_its_hypotheses(tmp_path: Path):
    """A run that undid some of its tracker's events (vanishing gradients on layers whose units then died and came
    back) and holds a run-level finding (an unstable loss) answers with the same events list at every question once
    closed, so the trace's index finds every event a hypothesis names. Until 2026-12-06 each question after the
    block rebuilt the list with new run-level finding objects: ``to_dict()`` and ``save()`` raised ``KeyError``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)
    with neuraldbg.NeuralDbg(model) as dbg:
        for step in range(1, 121):
            with torch.no_grad():  # the second layer's units die for 20 steps, live for 20, and so on
                model[2].bias.fill_(-100.0 if (step // 20) % 2 else 0.1)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if step in (30, 70):  # the ReLU's outputs as plain torch reads them: all zero while the bias is -100
                with torch.no_grad():
                    assert not (model[:4](x) > 0).any()
            if step == 45:
                with torch.no_grad():
                    assert (model[:4](x) > 0).any()
    hypotheses = dbg.hypotheses()
    assert hypotheses
    tracked = dbg._analyzer.tracker.events(final=True)
    run = [e for e in dbg.events if e.event_type is neuraldbg.EventType.RUN]
    assert run, "the case needs a run-level finding"
    assert len(dbg.events) < len(tracked) + len(run), "the case needs an event the run undid"
    assert dbg.events is dbg.events
    ids = {id(e) for e in dbg.events}
    assert all(id(h.root) in ids for h in dbg.hypotheses())
    trace = dbg.to_dict()
    path = dbg.save(tmp_path / "trace.json")
    loaded = neuraldbg.load(path)
    assert trace["events"] == json.loads(Path(path).read_text())["events"]
    assert [h.root.kind for h in loaded.hypotheses()] == [h.root.kind for h in hypotheses]
