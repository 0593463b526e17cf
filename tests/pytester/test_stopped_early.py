"""After ``-x`` (or ``--maxfail``) the reports say that the session stopped early, with or without xdist: a summary
that lists fewer tests than the suite has must not read as the whole suite's verdict."""

from __future__ import annotations

import pytest

TESTS = """
import models


def test_a_dead(neuraldbg):
    models.loop(neuraldbg, models.dead())


def test_b_healthy(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=10)
"""


@pytest.mark.parametrize("workers", [[], ["-n", "1"]])
def test_after_x_the_summary_and_the_terminal_say_the_session_stopped_early(
    project: pytest.Pytester, workers: list[str]
) -> None:
    if workers:
        pytest.importorskip("xdist")
    project.makepyfile(test_stop=TESTS)
    result = project.runpytest_subprocess(
        "-x", "--neuraldbg-gate", "--neuraldbg-report=report", "-p", "no:cacheprovider", *workers
    )
    result.assert_outcomes(failed=1)  # test_b_healthy never ran
    result.stdout.fnmatch_lines(["*the session stopped early (stopping after 1 failures): tests after it did not run"])
    summary = (project.path / "report" / "summary.md").read_text("utf-8")
    assert "**The session stopped early (stopping after 1 failures): tests after it did not run.**" in summary
    assert "test_b_healthy" not in summary and "**1 of 1 test watching training failed**" in summary


def test_a_session_that_ran_everything_does_not_say_so(project: pytest.Pytester) -> None:
    project.makepyfile(test_stop=TESTS)
    result = project.runpytest("-x", "--neuraldbg-report=report")
    result.assert_outcomes(passed=2)  # no gate: the dead run does not fail its test, so -x never stops
    assert "stopped early" not in result.stdout.str()
    assert "stopped early" not in (project.path / "report" / "summary.md").read_text("utf-8")


def test_an_interrupted_session_says_so_in_the_summary_and_the_terminal(project: pytest.Pytester) -> None:
    """Ctrl-C (here a test raising KeyboardInterrupt): the reports of the tests that ran are written, and say the
    session was interrupted, so they never read as the whole suite's verdict."""
    project.makepyfile(
        test_int="""
        import models

        def test_1(neuraldbg):
            neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=5)

        def test_2():
            raise KeyboardInterrupt

        def test_3(neuraldbg):
            neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=5)
        """
    )
    result = project.runpytest_subprocess("--neuraldbg-report=report", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*the session stopped early (interrupted): tests after it did not run"])
    summary = (project.path / "report" / "summary.md").read_text("utf-8")
    assert "**The session stopped early (interrupted): tests after it did not run.**" in summary
    assert "test_1" in summary and "test_3" not in summary
