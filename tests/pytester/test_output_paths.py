"""Output paths that cannot be written, and misspelt ini keys, are usage errors before any test runs (exit 4)."""

from __future__ import annotations

import os

import pytest

TEST = "def test_plain():\n    assert True\n"


def usage_error(result: pytest.RunResult) -> str:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert "test_plain" not in result.stdout.str()  # no test ran
    return result.stderr.str()


def test_a_report_folder_that_is_a_file_is_refused_at_start(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST)
    (pytester.path / "taken").write_text("a file", encoding="utf-8")
    err = usage_error(pytester.runpytest("--neuraldbg-report=taken/report"))
    assert "neuraldbg: --neuraldbg-report: cannot write report to" in err
    assert "taken is a file, not a folder" in err


def test_a_junit_path_that_is_a_folder_is_refused_at_start(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST)
    (pytester.path / "out").mkdir()
    err = usage_error(pytester.runpytest("--neuraldbg-junit=out"))
    assert "--neuraldbg-junit: cannot write junit to" in err and "it is a directory; expected the path of a file" in err


def test_a_junit_path_that_is_a_link_is_refused_at_start(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST)
    (pytester.path / "health.xml").symlink_to("/dev/null")
    err = usage_error(pytester.runpytest("--neuraldbg-junit=health.xml"))
    assert "it is not a regular file" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_refused_at_start(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST)
    locked = pytester.path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        err = usage_error(pytester.runpytest("--neuraldbg-report=locked/report"))
    finally:
        locked.chmod(0o700)
    assert "is not writable" in err


def test_a_misspelt_ini_key_names_the_key_that_exists(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST)
    pytester.makefile(".ini", pytest="[pytest]\nneuraldbg_gat = fail\n")
    err = usage_error(pytester.runpytest())
    assert "neuraldbg: ini neuraldbg_gat in pytest.ini: unknown key (did you mean 'neuraldbg_gate'?)" in err


def test_a_misspelt_ini_override_names_the_key_that_exists(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST)
    err = usage_error(pytester.runpytest("-o", "neuraldbg_reprot=out"))
    assert "ini neuraldbg_reprot (-o override): unknown key (did you mean 'neuraldbg_report'?)" in err


def test_writable_paths_still_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST)
    result = pytester.runpytest("--neuraldbg-report=new/deep/report", "--neuraldbg-junit=new/health.xml")
    result.assert_outcomes(passed=1)
    assert (pytester.path / "new" / "deep" / "report" / "summary.md").is_file()
    assert (pytester.path / "new" / "health.xml").is_file()


def test_the_plugins_junit_file_given_pytests_own_junitxml_path_is_refused_at_start(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST)
    err = usage_error(pytester.runpytest("--junitxml=health.xml", "--neuraldbg-junit=health.xml"))
    assert "--neuraldbg-junit:" in err and "health.xml is also pytest's --junitxml file" in err
    assert not (pytester.path / "health.xml").exists()


@pytest.mark.parametrize("inside", ["", "summary.md", "report.html"])
def test_the_junit_file_given_the_report_folder_or_one_of_its_files_is_refused_at_start(
    pytester: pytest.Pytester, inside: str
) -> None:
    pytester.makepyfile(TEST)
    junit = f"out/{inside}" if inside else "out"
    err = usage_error(pytester.runpytest("--neuraldbg-report=out", f"--neuraldbg-junit={junit}"))
    assert "is the report folder of --neuraldbg-report or one of its files" in err


def test_a_file_that_cannot_be_written_at_the_end_is_named_and_fails_the_run_and_the_others_are_written(
    project: pytest.Pytester,
) -> None:
    """A folder made where the summary goes after the session began (the start's check passed): the summary is
    named with why, the other files are still written and the passing session exits 4, with no traceback."""
    project.makepyfile(
        test_one="""
        import models

        def test_trains(neuraldbg):
            neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=5)
        """
    )
    (project.path / "rep" / "summary.md").mkdir(parents=True)
    result = project.runpytest("--neuraldbg-report=rep", "--neuraldbg-junit=health.xml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "Traceback" not in out + result.stderr.str()
    result.stdout.fnmatch_lines(["neuraldbg: could not write *rep/summary.md: is a directory*"])
    assert (project.path / "rep" / "report.html").is_file() and (project.path / "health.xml").is_file()
    assert list((project.path / "rep").glob("*.json"))  # the run's trace too
