"""``--neuraldbg-remove-stale-baselines``: delete the baseline files no test uses any more (and say so)."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = """
import models
import pytest

@pytest.mark.neuraldbg(baseline=True)
def test_kept(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=10)
"""

UPDATE = "--neuraldbg-update-baselines"
REMOVE = "--neuraldbg-remove-stale-baselines"


@pytest.fixture
def stale(project: pytest.Pytester) -> Path:
    """A project whose baseline folder holds the file of its test and one of a test that was renamed away."""
    project.makepyfile(test_mod=TESTS)
    project.runpytest(UPDATE).assert_outcomes(passed=1)
    folder = project.path / "__neuraldbg__" / "test_mod"
    (folder / "test_renamed.json").write_text((folder / "test_kept.json").read_text("utf-8"), "utf-8")
    return folder


def test_updating_lists_stale_files_and_offers_the_flag_without_deleting(project: pytest.Pytester, stale: Path) -> None:
    result = project.runpytest(UPDATE)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "stale baseline: __neuraldbg__/test_mod/test_renamed.json (no test test_renamed in test_mod.py)",
            "  remove them with --neuraldbg-remove-stale-baselines, or rename them after a renamed test and run "
            "--neuraldbg-update-baselines",
        ]
    )
    assert (stale / "test_renamed.json").exists()


@pytest.mark.parametrize("xdist", [False, True], ids=["one-process", "two-workers"])
def test_the_flag_deletes_the_stale_files_only_and_says_which(
    project: pytest.Pytester, stale: Path, xdist: bool
) -> None:
    if xdist:
        pytest.importorskip("xdist")
        result = project.runpytest_subprocess(UPDATE, REMOVE, "-n", "2", "-p", "no:cacheprovider")
        result.stdout.fnmatch_lines(["*2 workers*"])
    else:
        result = project.runpytest(UPDATE, REMOVE)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["removed stale baseline: __neuraldbg__/test_mod/test_renamed.json (no test test_renamed in test_mod.py)"]
    )
    assert "remove them with" not in result.stdout.str()
    assert sorted(p.name for p in stale.iterdir()) == ["test_kept.json"]


def test_a_module_selected_in_part_or_a_deselected_test_loses_nothing(project: pytest.Pytester, stale: Path) -> None:
    project.runpytest(REMOVE, "test_mod.py::test_kept").assert_outcomes(passed=1)
    assert (stale / "test_renamed.json").exists()  # the other tests of a partly selected module are unknown
    project.runpytest(REMOVE, "-k", "nothing_matches").assert_outcomes(deselected=1)
    assert (stale / "test_kept.json").exists()  # deselected tests still exist


def test_emptied_folders_go_too_and_the_flag_reads_the_ini_file(project: pytest.Pytester, stale: Path) -> None:
    (stale / "test_kept.json").rename(stale / "test_also_gone.json")
    project.makepyfile(test_mod="def test_plain():\n    pass\n")
    project.makeini("[pytest]\nneuraldbg_remove_stale_baselines = true\n")
    result = project.runpytest()
    result.assert_outcomes(passed=1)
    assert result.stdout.str().count("removed stale baseline:") == 2
    assert not (project.path / "__neuraldbg__").exists()
