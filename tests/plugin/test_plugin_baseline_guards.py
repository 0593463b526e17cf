"""The baseline reader has the trace reader's guards; names and comparisons survive any layer or test name."""

from __future__ import annotations

import os
import signal
import stat
import threading
from pathlib import Path
from typing import Any, NoReturn

import pytest

from pytest_neuraldbg import baseline
from pytest_neuraldbg.baseline import POINTS, BaselineError, Tolerances, compare_run, file_name, stale_files
from pytest_neuraldbg.baseline.files import MAX_BASELINE_BYTES
from pytest_neuraldbg.options import Settings


def _run(**changes: Any) -> dict[str, Any]:
    run: dict[str, Any] = {
        "at_step": [0, 5, 10, 14, 19],
        "points": [label for label, _ in POINTS],
        "steps_observed": 20,
        "model": "Sequential",
        "layers": {"fc1": {"grad_norm": [1.0] * 5}, "fc1²": {"grad_norm": [1.0] * 5}, "fc10": {"grad_norm": [1.0] * 5}},
        "verdicts": [],
        "environment": {"torch_version": "2.13.0"},
    }
    run.update(changes)
    return run


def _error(path: Path) -> str:
    with pytest.raises(BaselineError) as info:
        baseline.load(path)
    text = str(info.value)
    assert "\n" not in text
    return text


def _valid_text() -> str:
    return baseline.dumps(baseline.document("test_it", {"1": _run()}))


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "test_it.json"
    os.mkfifo(fifo)
    done: list[str] = []
    reader = threading.Thread(target=lambda: done.append(_error(fifo)), daemon=True)
    reader.start()
    reader.join(10)
    if not done:  # the reader blocks on open(): free it by opening the write end, then fail
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("reading a FIFO blocked")
    assert "is a FIFO (named pipe), not a regular file; expected a JSON baseline file" in done[0]


def test_a_link_to_an_endless_device_is_refused_before_reading(tmp_path: Path) -> None:
    link = tmp_path / "test_it.json"
    link.symlink_to("/dev/zero")
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("reading /dev/zero did not stop"))
    signal.alarm(20)
    try:
        assert "is a character device (through a symbolic link), not a regular file" in _error(link)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_file_over_the_size_cap_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "test_it.json"
    with open(path, "wb") as fh:
        fh.truncate(MAX_BASELINE_BYTES + 1)  # sparse: costs nothing on disk
    assert f"is {MAX_BASELINE_BYTES + 1} bytes, more than the {MAX_BASELINE_BYTES} a baseline may have" in _error(path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[" * 100_000 + "]" * 100_000, "JSON nested 100000 levels deep; a NeuralDBG baseline nests at most 64"),
        ('{"version": ' + "9" * 400 + "}", "a number with more than 24 digits in a row"),
        ('{"version": ' + "9" * 5000 + "}", "a number with more than 24 digits in a row"),
        ('{"version": NaN}', "a bare NaN, which is not JSON"),
        ('{"version": -Infinity}', "a bare -Infinity, which is not JSON"),
        ('{"version": 1e400}', "version: a number too large for a float; a baseline holds none"),
        ("", "the file is empty; expected a NeuralDBG JSON baseline"),
        ("\udcff", "not a text file"),
    ],
)
def test_hostile_json_is_one_clear_error_not_a_crash(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "test_it.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert problem in _error(path)


@pytest.mark.parametrize("value", ["1e300", "-1e301", "1.5e308"])
def test_a_stored_number_must_be_finite_and_bounded(tmp_path: Path, value: str) -> None:
    path = tmp_path / "test_it.json"
    path.write_text(_valid_text().replace("[1.0, 1.0, 1.0, 1.0, 1.0]", f"[{value}, 1.0, 1.0, 1.0, 1.0]", 1), "utf-8")
    if value == "1e300":
        assert baseline.load(path) is not None  # the bound itself is accepted
    else:
        assert "expected a list of 5 numbers" in _error(path)


def test_an_invalid_file_names_the_layer_escaped_and_the_value_cut(tmp_path: Path) -> None:
    doc = baseline.document("test_it", {"1": _run(layers={"bad\x1b[2Kname": {"grad_norm": ["x" * 500]}})})
    path = tmp_path / "test_it.json"
    path.write_text(baseline.dumps(doc), "utf-8")
    text = _error(path)
    assert "\x1b" not in text and "\\x1b" in text and len(text) < 300


HOSTILE = "fc\x1b[2K\x1b[32mPASSED\x1b[0m\u202e"
SHOWN = "fc\\x1b[2K\\x1b[32mPASSED\\x1b[0m\\u202e"


def _is_inert(text: str) -> bool:
    return not any(c in text for c in "\x1b\u202e\udc80")


def test_hostile_layer_and_run_names_reach_every_baseline_text_as_visible_escapes(tmp_path: Path) -> None:
    runs = {"a\u202e": _run(), "b": _run(layers={HOSTILE: {"grad_norm": [1.0] * 5}})}
    path = tmp_path / "test_it.json"
    baseline.write(path, baseline.document("test_it", runs))
    check = baseline.BaselineCheck(
        path=path, shown_path="d/test_it.json", nodeid="t.py::test_it\x1b[2K", test_id="test_it", settings=Settings()
    )
    hypothesis = {"kind": "dead_neurons", "summary": f"dead_neurons at '{HOSTILE}'", "explanation": HOSTILE}
    hypothesis["chain"] = [{"text": f"dead at '{HOSTILE}'", "cause": None}]
    grown = _run(layers={HOSTILE: {"grad_norm": [1000.0] * 5}}, verdicts=[{"kind": "dead_neurons", "layer": HOSTILE}])
    with pytest.raises(AssertionError) as info:
        check.check({"b": baseline.Observed(grown, [hypothesis])}, complete=False, fail=_raise)
    text = str(info.value)
    assert _is_inert(text) and SHOWN in text and "t.py::test_it\\x1b[2K" in text
    assert text.splitlines()[0].startswith(
        f"NeuralDBG baseline regression: run b: new failure dead_neurons at '{SHOWN}'"
    )
    table = text.split("(the worst point of each metric and layer):\n")[1].split("\n\n")[0].splitlines()
    assert table[2].split()[:2] == ["grad_norm", SHOWN]
    assert table[0].index("point") == table[2].index("first")  # columns measured on the escaped name
    assert all(_is_inert(line) for line in check.notes[-1]["lines"]) and check.notes[-1]["text"] == text
    with pytest.raises(AssertionError) as info:  # a stored run's name in a problem
        check.check({"c": baseline.Observed(_run())}, complete=False, fail=_raise)
    assert _is_inert(str(info.value)) and "a\\u202e" in str(info.value)


def _raise(text: str) -> NoReturn:
    raise AssertionError(text)


def test_a_layer_name_with_a_superscript_digit_compares_like_any_other() -> None:
    comparison = compare_run("1", _run(), _run(), Tolerances())
    assert comparison.rows == []
    changed = _run(layers={**_run()["layers"], "fc1²": {"grad_norm": [1000.0] * 5}})
    found = compare_run("1", _run(), changed, Tolerances())
    assert {row.layer for row in found.regressions} == {"fc1²"}


@pytest.mark.parametrize(("first", "second"), [("a::b", "a.b"), ("A::b[x]", "A.b[x]"), ("T::t::u", "T.t::u")])
def test_ids_that_differ_only_by_a_class_separator_and_a_dot_get_two_files(first: str, second: str) -> None:
    assert file_name(first) != file_name(second)
    assert file_name("TestA::test_b") == "TestA.test_b.json"  # the usual ids keep their readable names


def test_the_baselines_of_a_deleted_test_module_are_stale(tmp_path: Path) -> None:
    kept = tmp_path / "test_kept.py"
    kept.write_text("def test_a(): pass\n", "utf-8")
    folder = tmp_path / "__neuraldbg__"
    (folder / "test_kept").mkdir(parents=True)
    (folder / "test_kept" / "test_a.json").write_text(_valid_text(), "utf-8")
    (folder / "test_gone").mkdir()
    gone = folder / "test_gone" / "test_it.json"
    gone.write_text(_valid_text(), "utf-8")
    (folder / "test_data").mkdir()  # a module another collector reads (test_data.yaml) is still there
    (tmp_path / "test_data.yaml").write_text("", "utf-8")
    (folder / "test_data" / "test_y.json").write_text(_valid_text(), "utf-8")
    found = stale_files([(kept, "test_a")], lambda _: False)
    assert found == [(gone, "test_it")]
    # a FIFO among the files is listed without hanging the listing
    os.mkfifo(folder / "test_gone" / "test_pipe.json")
    names = [(p.name, t) for p, t in stale_files([(kept, "test_a")], lambda _: False)]
    assert names == [("test_it.json", "test_it"), ("test_pipe.json", "test_pipe")]
    assert stat.S_ISFIFO(os.lstat(folder / "test_gone" / "test_pipe.json").st_mode)
