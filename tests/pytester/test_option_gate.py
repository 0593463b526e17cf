"""``--neuraldbg-gate``: fail (or only report) tests whose watched training is unhealthy."""

from __future__ import annotations

import pytest
from integration_support import SILENT_TESTS, junit_cases


@pytest.fixture
def silent(project: pytest.Pytester) -> pytest.Pytester:
    project.makepyfile(test_silent=SILENT_TESTS)
    return project


def test_the_gate_fails_a_test_that_asserts_nothing_about_its_dead_relu(silent: pytest.Pytester) -> None:
    result = silent.runpytest("--junitxml=junit.xml", "--neuraldbg-gate=fail")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_dead _*",
            "NeuralDBG gate: training is unhealthy - dead_neurons at '3' from step 0 (confidence *)",
            "",
            "Dead neurons in '3' (ReLU)*",
            "Causal chain (root first):",
            "  root '3': * units dead (never positive), steps 0-*",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED test_silent.py::test_dead - NeuralDBG gate: training is unhealthy*"])
    # pytest's own JUnit agrees with the terminal: a failure whose message is the verdict line
    failure = junit_cases(silent.path / "junit.xml")["test_silent::test_dead"].find("failure")
    assert failure is not None
    assert failure.get("message", "").startswith("NeuralDBG gate: training is unhealthy - dead_neurons at '3'")
    assert "Dead neurons in '3' (ReLU)" in (failure.text or "")


def test_a_bare_gate_flag_means_fail(silent: pytest.Pytester) -> None:
    silent.runpytest("--neuraldbg-gate").assert_outcomes(passed=1, failed=1)


def test_warn_reports_the_unhealthy_run_without_failing(silent: pytest.Pytester) -> None:
    result = silent.runpytest("--neuraldbg-gate=warn")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*= neuraldbg =*",
            "2 watched runs: 1 unhealthy (gate: warn)",
            "UNHEALTHY test_silent.py::test_dead: dead_neurons at '3' from step 0 (confidence *)",
        ]
    )


@pytest.mark.parametrize("args", [(), ("--neuraldbg-gate=off",)])
def test_without_the_gate_unhealthy_training_only_shows_in_the_summary(
    silent: pytest.Pytester, args: tuple[str, ...]
) -> None:
    result = silent.runpytest(*args)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["UNHEALTHY test_silent.py::test_dead: *"])


def test_the_gate_is_read_from_the_environment_and_the_failure_says_so(
    silent: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURALDBG_GATE", "fail")
    result = silent.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["Failed by the NeuralDBG gate (gate=fail from env NEURALDBG_GATE).*"])


def test_a_marker_turns_the_gate_off_for_a_test_that_trains_a_broken_model_on_purpose(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(
        test_on_purpose="""
        import models
        import pytest

        @pytest.mark.neuraldbg(gate="off")
        def test_detects_the_dead_relu(neuraldbg):
            ndbg = models.loop(neuraldbg, models.dead())
            assert ndbg.hypotheses()[0].root.layer == "3"
        """
    )
    project.runpytest("--neuraldbg-gate=fail").assert_outcomes(passed=1)


def test_a_test_that_already_failed_keeps_its_own_failure_and_gets_the_explanation_as_a_section(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(
        test_own="""
        import models

        def test_loss_goes_down(neuraldbg):
            models.loop(neuraldbg, models.dead())
            assert 1 == 2, "the loss did not go down"
        """
    )
    result = project.runpytest("--neuraldbg-gate=fail")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E       AssertionError: the loss did not go down",
            "*- NeuralDBG training health -*",
            "NeuralDBG: training is unhealthy - dead_neurons at '3' from step 0*",
        ]
    )
    assert "NeuralDBG gate:" not in result.stdout.str()


def test_a_test_that_already_failed_shows_its_own_failure_in_the_summary_and_junit_before_the_explanation(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(
        test_own="""
        import models

        def test_loss_goes_down(neuraldbg):
            models.loop(neuraldbg, models.dead())
            raise ValueError("the loss did not go down")
        """
    )
    result = project.runpytest("--neuraldbg-gate=fail", "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert text.index("E       ValueError: the loss did not go down") < text.index("NeuralDBG: training is unhealthy")
    result.stdout.fnmatch_lines(["FAILED test_own.py::test_loss_goes_down - ValueError: the loss did not go down"])
    failure = junit_cases(project.path / "junit.xml")["test_own::test_loss_goes_down"].find("failure")
    assert failure is not None
    assert failure.get("message", "") == "ValueError: the loss did not go down"
    assert "NeuralDBG gate:" not in text


# --- with xfail: the gate fails the test in its call phase, where xfail looks ------------------------------------

XFAIL_TESTS = """
import models
import pytest

@pytest.mark.xfail({marker})
def test_{kind}(neuraldbg):
    neuraldbg.smoke_train(models.{kind}(), models.data(), models.loss, steps=30)
"""


@pytest.mark.parametrize("marker", ["strict=True", "strict=False", "strict=True, raises=AssertionError"])
def test_an_xfail_test_that_trains_an_unhealthy_model_and_asserts_nothing_is_xfailed_by_the_gate(
    project: pytest.Pytester, marker: str
) -> None:
    project.makepyfile(test_xfail=XFAIL_TESTS.format(marker=marker, kind="dead"))
    result = project.runpytest("--neuraldbg-gate", "-rx", "--junitxml=junit.xml")
    result.assert_outcomes(xfailed=1)
    result.stdout.fnmatch_lines(["1 watched run: 1 unhealthy (gate: fail)", "XFAIL test_xfail.py::test_dead*"])
    case = junit_cases(project.path / "junit.xml")["test_xfail::test_dead"]
    assert case.find("failure") is None and case.find("skipped") is not None


def test_without_the_gate_the_same_xfail_strict_test_passes_unexpectedly(project: pytest.Pytester) -> None:
    project.makepyfile(test_xfail=XFAIL_TESTS.format(marker="strict=True", kind="dead"))
    for args in [("--neuraldbg-gate=warn",), ("--neuraldbg-gate=off",)]:
        result = project.runpytest(*args)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["FAILED test_xfail.py::test_dead - *XPASS(strict)*"])


def test_an_xfail_strict_test_whose_training_is_healthy_passes_unexpectedly_under_the_gate(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(test_xfail=XFAIL_TESTS.format(marker="strict=True", kind="healthy"))
    result = project.runpytest("--neuraldbg-gate")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["FAILED test_xfail.py::test_healthy - *XPASS(strict)*"])
    assert "NeuralDBG gate:" not in result.stdout.str()


# --- with a baseline: one failure, both verdict lines first --------------------------------------------------

BASELINE_TEST = """
import os

import models
import pytest

@pytest.mark.neuraldbg(baseline=True)
def test_marked(neuraldbg):
    model = models.dead() if os.environ.get("DEAD") else models.healthy()
    neuraldbg.smoke_train(model, models.data(), models.loss, steps=20)
"""


def test_a_baseline_regression_and_the_gate_fail_the_test_once_with_both_verdict_lines_first(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    project.makepyfile(test_both=BASELINE_TEST)
    project.runpytest("--neuraldbg-update-baselines").assert_outcomes(passed=1)
    monkeypatch.setenv("DEAD", "1")
    result = project.runpytest("--neuraldbg-gate", "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_marked _*",
            "NeuralDBG gate: training is unhealthy - dead_neurons at '3' from step 0 (confidence *)",
            "NeuralDBG baseline regression: new failure dead_neurons at '3'; +* more",
            "",
            "Failed by the NeuralDBG gate (gate=fail from --neuraldbg-gate).*",
            "",
            "Baseline: __neuraldbg__/test_both/test_marked.json",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "NeuralDBG's diagnosis: training is unhealthy - dead_neurons at '3' from step 0 (confidence *)",
            "Dead neurons in '3' (ReLU)*",
        ]
    )
    text = result.stdout.str()
    assert text.count("Dead neurons in '3' (ReLU)") == 1  # explained once, by the baseline's diagnosis
    assert "- NeuralDBG training health -" not in text  # the failure explains the run: no extra section
    result.stdout.fnmatch_lines(["baselines: 1 regressed", "FAILED test_both.py::test_marked - NeuralDBG gate: *"])
    failure = junit_cases(project.path / "junit.xml")["test_both::test_marked"].find("failure")
    assert failure is not None
    gate_line, baseline_line = failure.get("message", "").splitlines()[:2]
    assert gate_line.startswith("NeuralDBG gate: training is unhealthy - dead_neurons at '3'")
    assert baseline_line.startswith("NeuralDBG baseline regression: new failure dead_neurons at '3'")


def test_a_baseline_failure_of_a_healthy_run_is_the_tests_only_failure_under_the_gate(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(test_both=BASELINE_TEST)
    project.runpytest("--neuraldbg-update-baselines").assert_outcomes(passed=1)
    project.path.joinpath("__neuraldbg__/test_both/test_marked.json").write_text("not json")
    result = project.runpytest("--neuraldbg-gate")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["NeuralDBG baseline __neuraldbg__/test_both/test_marked.json is not valid JSON*", "FAILED *"]
    )
    assert "NeuralDBG gate:" not in result.stdout.str()


# --- a bare flag never takes the test path after it ----------------------------------------------------------


@pytest.mark.parametrize("xdist", [False, True], ids=["one-process", "two-workers"])
def test_a_bare_gate_flag_before_a_test_path_gates_the_tests_of_that_path(silent: pytest.Pytester, xdist: bool) -> None:
    tests = silent.mkdir("tests")
    for module in ("test_silent.py", "models.py"):
        (silent.path / module).rename(tests / module)
    silent.makepyfile(test_elsewhere="def test_not_collected():\n    raise AssertionError('outside tests/')\n")
    if xdist:
        pytest.importorskip("xdist")
        result = silent.runpytest_subprocess("--neuraldbg-gate", "tests", "-n", "2", "-p", "no:cacheprovider")
        result.stdout.fnmatch_lines(["*2 workers*"])
    else:
        result = silent.runpytest("--neuraldbg-gate", "tests")
    result.assert_outcomes(passed=1, failed=1)  # only tests/ ran, and the gate is on
    result.stdout.fnmatch_lines(["FAILED tests/test_silent.py::test_dead - NeuralDBG gate: training is unhealth*"])


def test_a_bare_gate_flag_in_addopts_leaves_the_command_lines_paths_alone(silent: pytest.Pytester) -> None:
    tests = silent.mkdir("tests")
    for module in ("test_silent.py", "models.py"):
        (silent.path / module).rename(tests / module)
    silent.makeini("[pytest]\naddopts = --neuraldbg-gate\n")
    result = silent.runpytest("tests")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["Failed by the NeuralDBG gate (gate=fail from --neuraldbg-gate).*"])


# --- expected failures: a test that asserted on the failure it expects --------------------------------------

EXPECTED = """
import models
import pytest
from pytest_neuraldbg import assert_healthy, assert_learns, assert_no_dead_neurons


def test_expects_the_dead_relu(neuraldbg):
    ndbg = neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=30)
    with pytest.raises(AssertionError, match="dead_neurons at '3' from step 0"):
        assert_no_dead_neurons(ndbg)


def test_expects_it_not_to_learn(neuraldbg):
    ndbg = neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=30, overfit=True)
    with pytest.raises(AssertionError, match="dead_neurons at '3'"):
        assert_learns(ndbg)


def test_expects_one_failure_of_two_runs(neuraldbg):
    checked = neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=30, name="checked")
    neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=30, name="unchecked")
    with pytest.raises(AssertionError):
        assert_healthy(checked)


def test_expects_with_the_bare_idiom(neuraldbg):
    ndbg = neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=30)
    with pytest.raises(AssertionError):
        assert not ndbg.explain_failure()
"""


def test_a_caught_failure_is_not_called_asserted_when_the_test_errors_in_its_teardown(project: pytest.Pytester) -> None:
    """The summary's "asserted by the test" is for a test that passed: one whose teardown then raised is an error,
    as pytest counts it (its teardown report comes after the call report that carried its runs)."""
    project.makepyfile(
        test_torn="""
        import models
        import pytest
        from pytest_neuraldbg import assert_no_dead_neurons


        @pytest.fixture
        def breaks_on_teardown():
            yield
            raise RuntimeError("teardown broke")


        def test_caught_then_torn(neuraldbg, breaks_on_teardown):
            ndbg = neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=30)
            with pytest.raises(AssertionError):
                assert_no_dead_neurons(ndbg)
        """
    )
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["UNHEALTHY test_torn.py::test_caught_then_torn: dead_neurons at '3' *"])
    assert "(asserted by the test)" not in result.stdout.str()


@pytest.mark.parametrize("xdist", [False, True], ids=["one-process", "two-workers"])
def test_a_failure_the_test_asserted_on_and_expected_is_not_failed_again_by_the_gate(
    project: pytest.Pytester, xdist: bool
) -> None:
    project.makepyfile(test_expected=EXPECTED)
    args = ("--neuraldbg-gate", "--junitxml=junit.xml", "-p", "no:cacheprovider")
    if xdist:
        pytest.importorskip("xdist")
        result = project.runpytest_subprocess(*args, "-n", "2")
    else:
        result = project.runpytest(*args)
    result.assert_outcomes(passed=2, failed=2)
    cases = junit_cases(project.path / "junit.xml")
    assert {name for name, case in cases.items() if case.find("failure") is None} == {
        "test_expected::test_expects_the_dead_relu",
        "test_expected::test_expects_it_not_to_learn",
    }
    # another run's failure that nothing asserted on still fails the test, and only that run is named
    unchecked = cases["test_expected::test_expects_one_failure_of_two_runs"].find("failure")
    assert unchecked is not None
    assert unchecked.get("message", "").startswith(
        "NeuralDBG gate: training is unhealthy - run unchecked: dead_neurons at '3' from step 0"
    )
    assert (unchecked.text or "").count("Dead neurons in '3' (ReLU)") == 1
    # `assert not ndbg.explain_failure()` inside pytest.raises tells the plugin nothing: the gate fails it, and
    # its text says what to write instead
    bare = cases["test_expected::test_expects_with_the_bare_idiom"].find("failure")
    assert bare is not None and bare.get("message", "").startswith("NeuralDBG gate: training is unhealthy")
    result.stdout.fnmatch_lines(
        [
            "Failed by the NeuralDBG gate (gate=fail from --neuraldbg-gate). For a test that trains a broken model on "
            "purpose, assert on the failure it expects (with pytest.raises(AssertionError): "
            'assert_no_dead_neurons(ndbg)) or use @pytest.mark.neuraldbg(gate="off").'
        ]
    )
    # the run stays unhealthy in the summary, marked as asserted by its test
    result.stdout.fnmatch_lines(
        ["UNHEALTHY test_expected.py::test_expects_the_dead_relu: dead_neurons at '3' * (asserted by the test)"]
    )
