"""Output that cannot be written (a full disk, a closed pipe) is the environment's failure, not a bug of NeuralDBG:
one line and exit 2, and nothing at all when the reader went away."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import support

from neuraldbg.cli import main


class _Failing(io.StringIO):
    """A standard output whose every write fails as ``error`` does."""

    def __init__(self, error: OSError) -> None:
        super().__init__()
        self.error = error

    def write(self, text: str) -> int:
        raise self.error


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    dbg, _ = support.train(support.mlp(), support.regression_batches(), steps=5)
    return dbg.save(tmp_path_factory.mktemp("out") / "t.json")


def test_a_full_disk_on_stdout_is_one_line_and_exit_2_not_an_internal_error(
    trace_path: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(sys, "stdout", _Failing(OSError(28, "No space left on device")))
    assert main(["explain", trace_path]) == 2
    assert capsys.readouterr().err == "neuraldbg explain: cannot write the output: No space left on device\n"


def test_a_closed_pipe_on_stdout_exits_2_without_a_word(
    trace_path: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(sys, "stdout", _Failing(BrokenPipeError(32, "Broken pipe")))
    assert main(["explain", trace_path, "--json"]) == 2
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_explain_into_dev_full_says_so_once_and_exits_2(trace_path: str):
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "neuraldbg.cli", "explain", trace_path],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    assert done.returncode == 2
    assert done.stderr == "neuraldbg explain: cannot write the output: No space left on device\n"


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path):
    """``neuraldbg demo --all | head -1``: the demo's output outgrows the pipe once its reader has gone."""
    reader = subprocess.Popen(
        [sys.executable, "-m", "neuraldbg.cli", "demo", "--all"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.readline()
    reader.stdout.close()
    err = reader.stderr.read().decode()
    assert reader.wait(timeout=300) == 2
    assert err == ""
