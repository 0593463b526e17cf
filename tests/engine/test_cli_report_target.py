"""``neuraldbg report -o``: the report never replaces one of the traces it reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import support

from neuraldbg.cli import main


@pytest.fixture
def trace_path(tmp_path: Path) -> Path:
    dbg, _ = support.train(support.mlp(), support.regression_batches(), steps=5)
    return Path(dbg.save(tmp_path / "t.json"))


def _refused(capsys: pytest.CaptureFixture[str], output: str, trace: str) -> None:
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"neuraldbg report: {output}: is the input trace {trace}; writing the report there would replace the "
        "trace: give another output file\n"
    )


def test_report_refuses_to_write_over_its_input_trace_and_keeps_it(
    trace_path: Path, capsys: pytest.CaptureFixture[str]
):
    before = trace_path.read_bytes()
    assert main(["report", str(trace_path), "-o", str(trace_path), "--no-pictures"]) == 2
    _refused(capsys, str(trace_path), str(trace_path))
    assert trace_path.read_bytes() == before


def test_the_same_trace_named_another_way_is_refused_too(
    trace_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    before = trace_path.read_bytes()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    assert main(["report", "t.json", "-o", "sub/../t.json", "--no-pictures"]) == 2
    _refused(capsys, "sub/../t.json", "t.json")
    (tmp_path / "link.json").symlink_to(trace_path)
    assert main(["report", "link.json", "-o", "t.json", "--no-pictures"]) == 2
    _refused(capsys, "t.json", "link.json")
    os.link(trace_path, tmp_path / "hard.json")
    assert main(["report", "t.json", "-o", "hard.json", "--no-pictures"]) == 2
    _refused(capsys, "hard.json", "t.json")
    assert trace_path.read_bytes() == before


def test_a_trace_of_an_input_folder_is_an_input_too(
    trace_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    before = trace_path.read_bytes()
    assert main(["report", str(tmp_path), "-o", str(trace_path), "--no-pictures"]) == 2
    _refused(capsys, str(trace_path), str(trace_path))
    assert trace_path.read_bytes() == before


def test_a_report_beside_its_traces_is_written(trace_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "report.html"), "--no-pictures"]) == 0
    assert "report written to" in capsys.readouterr().out
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")
