"""``neuraldbg demo --save``: where each demo's trace goes, and a path it cannot write to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import neuraldbg.plugins.manager
from neuraldbg.cli import main
from neuraldbg.demo import DEMOS


def test_demo_save_to_a_folder_is_one_line_and_exit_2_before_any_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert main(["demo", "--no-graph", "--save", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"neuraldbg demo: {tmp_path}: is a directory; expected the path of a regular file to write\n"
    assert "=== demo" not in captured.out  # refused before the demo trained


@pytest.mark.skipif(not os.path.exists(os.devnull) or os.name != "posix", reason="needs a POSIX /dev/null")
def test_demo_save_to_dev_null_or_a_symbolic_link_is_refused_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert main(["demo", "--no-graph", "--save", os.devnull]) == 2
    assert capsys.readouterr().err == (
        f"neuraldbg demo: {os.devnull}: is a character device; expected the path of a regular file to write\n"
    )
    target = tmp_path / "kept.json"
    target.write_text("kept")
    (tmp_path / "link.json").symlink_to(target)
    assert main(["demo", "--no-graph", "--save", str(tmp_path / "link.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"neuraldbg demo: {tmp_path / 'link.json'}: is a symbolic link")
    assert target.read_text() == "kept"


def test_a_save_path_ending_in_a_separator_names_a_folder_and_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    given = str(tmp_path / "new") + os.sep
    assert main(["demo", "--all", "--no-graph", "--save", given]) == 2
    assert "ends with a path separator, so it names a folder" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_a_plugin_that_cannot_be_loaded_makes_the_demo_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    def broken(extra: object = ()) -> object:
        raise ModuleNotFoundError("No module named 'badplug_mod_missing'")

    monkeypatch.setattr(neuraldbg.plugins.manager, "manager", broken)
    assert main(["demo", "--no-graph"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("neuraldbg demo: NeuralDbg: loading plugins failed:") and "badplug_mod_missing" in err


def test_demo_all_saves_each_demo_to_its_own_file_named_before_the_suffix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    folder = tmp_path / "runs.json.d"  # ".json" in a folder's name is the folder's, never rewritten
    assert main(["demo", "--all", "--no-graph", "--save", str(folder / "t.json")]) == 0
    out = capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == ["runs.json.d"]
    assert sorted(os.listdir(folder)) == sorted(f"t-{name}.json" for name in DEMOS)
    for name in DEMOS:
        assert f"trace written to {folder / f't-{name}.json'}" in out


def test_demo_all_with_a_save_path_without_suffix_still_writes_one_file_per_demo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    two = dict(list(DEMOS.items())[:2])
    monkeypatch.setattr("neuraldbg.demo.DEMOS", two)
    assert main(["demo", "--all", "--no-graph", "--save", str(tmp_path / "trace")]) == 0
    assert sorted(os.listdir(tmp_path)) == sorted(f"trace-{name}" for name in two)
    capsys.readouterr()
