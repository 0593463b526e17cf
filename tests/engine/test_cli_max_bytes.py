"""The size limit of a trace read (``--max-bytes``, ``load(max_bytes=...)``): it bounds what is read, never what
is set aside, and a limit that is no whole number of bytes is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import support

import neuraldbg
from neuraldbg import ConfigError
from neuraldbg.cli import main

ONE_TEBIBYTE = 2**40


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dbg, _ = support.train(support.mlp(), support.regression_batches(), steps=5)
    return Path(dbg.save(tmp_path_factory.mktemp("limit") / "t.json"))


@pytest.mark.parametrize("limit", [ONE_TEBIBYTE, 2**63 - 1, 2**63, 10**30])
def test_a_huge_limit_reads_a_small_trace_without_setting_the_limit_aside(trace_path: Path, limit: int):
    assert neuraldbg.load(trace_path, max_bytes=limit).steps == 5


@pytest.mark.parametrize("limit", [str(ONE_TEBIBYTE), str(2**63 - 1)])
def test_explain_with_a_huge_max_bytes_explains_the_trace(
    trace_path: Path, limit: str, capsys: pytest.CaptureFixture[str]
):
    assert main(["explain", str(trace_path), "--max-bytes", limit]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "healthy" in captured.out


@pytest.mark.parametrize("limit", [None, "100", 1.5, 100.0, True, 0, -1])
def test_a_limit_that_is_no_whole_number_of_bytes_is_a_config_error_naming_it(trace_path: Path, limit: object):
    with pytest.raises(ConfigError) as info:
        neuraldbg.load(trace_path, max_bytes=limit)  # type: ignore[arg-type]
    assert str(info.value) == (
        f"neuraldbg.load(): max_bytes: expected a whole number of bytes, at least 1, got {limit!r}"
    )


@pytest.mark.parametrize("limit", ["-1", "1.5", "1e9", "none"])
def test_explain_refuses_a_max_bytes_that_is_no_positive_whole_number(
    trace_path: Path, limit: str, capsys: pytest.CaptureFixture[str]
):
    with pytest.raises(SystemExit) as info:
        main(["explain", str(trace_path), "--max-bytes", limit])
    assert info.value.code == 2
    assert f"expected a positive number of bytes, got {limit!r}" in capsys.readouterr().err


def test_a_file_that_grows_past_the_limit_while_read_is_still_refused(
    trace_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The size checked before opening can be stale: what is read is bounded by the limit too."""
    from neuraldbg import trace as trace_module

    monkeypatch.setattr(trace_module, "_READ_STEP", 7)  # many small reads: the limit is kept across them
    size = trace_path.stat().st_size
    real_stat = trace_module.os.stat

    def smaller(path: object, *args: object, **kwargs: object) -> object:
        result = real_stat(path, *args, **kwargs)  # type: ignore[arg-type]
        fields = list(result)
        fields[6] = 10  # st_size: the file looked small when checked
        return type(result)(fields)

    monkeypatch.setattr(trace_module.os, "stat", smaller)
    with pytest.raises(neuraldbg.TraceError, match=f"holds more than the {size - 1} bytes a trace may have"):
        neuraldbg.load(trace_path, max_bytes=size - 1)
    assert neuraldbg.load(trace_path, max_bytes=size).steps == 5
