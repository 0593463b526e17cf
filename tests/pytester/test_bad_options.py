"""Bad option values: each error names the value, where it came from and what was expected."""

from __future__ import annotations

import pytest


def usage_error(result: pytest.RunResult) -> str:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    return result.stderr.str()


def test_a_bad_flag_names_the_flag_the_value_and_the_expected_range(pytester: pytest.Pytester) -> None:
    err = usage_error(pytester.runpytest("--neuraldbg-persistence=abc"))
    assert (
        "ERROR: neuraldbg: --neuraldbg-persistence: invalid value 'abc' for persistence: "
        "expected an integer between 1 and 1000"
    ) in err


def test_a_bad_ini_value_names_the_key_and_the_file(pytester: pytest.Pytester) -> None:
    pytester.makefile(".ini", pytest="[pytest]\nneuraldbg_persistence = often\n")
    err = usage_error(pytester.runpytest())
    assert "ini neuraldbg_persistence in pytest.ini: invalid value 'often' for persistence: expected an integer" in err


def test_an_ini_override_on_the_command_line_is_named_as_such(pytester: pytest.Pytester) -> None:
    err = usage_error(pytester.runpytest("-o", "neuraldbg_gate=maybe"))
    assert "ini neuraldbg_gate (-o override): invalid value 'maybe' for gate: expected one of fail, warn, off" in err


def test_a_bad_environment_variable_names_the_variable(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURALDBG_STEPS", "0")
    err = usage_error(pytester.runpytest())
    assert "env NEURALDBG_STEPS: invalid value '0' for steps: expected an integer between 1 and 10000000" in err


def test_an_unknown_preset_lists_the_presets(pytester: pytest.Pytester) -> None:
    err = usage_error(pytester.runpytest("--neuraldbg-preset=turbo"))
    assert "--neuraldbg-preset: invalid value 'turbo' for preset: expected a preset name, one of default, full" in err


def test_a_gate_value_written_after_a_space_is_refused_with_the_spelling_that_works(pytester: pytest.Pytester) -> None:
    err = usage_error(pytester.runpytest("--neuraldbg-gate", "warn"))
    assert (
        "ERROR: neuraldbg: --neuraldbg-gate takes its value after '=': write --neuraldbg-gate=warn "
        "(a bare --neuraldbg-gate means fail and never takes the next argument)"
    ) in err


def test_bad_markers_fail_only_their_own_test_and_name_marker_test_and_expectation(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_markers="""
        import models
        import pytest

        @pytest.mark.neuraldbg(persistence="x")
        def test_bad_engine_value(neuraldbg):
            pass

        @pytest.mark.neuraldbg(persistance=3)
        def test_misspelt_option(neuraldbg):
            pass

        @pytest.mark.neuraldbg(gate="sometimes")
        def test_bad_gate(neuraldbg):
            pass

        @pytest.mark.neuraldbg(5)
        def test_positional(neuraldbg):
            pass

        def test_fine(neuraldbg):
            neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=5)
        """
    )
    result = project.runpytest()
    result.assert_outcomes(passed=1, errors=4)
    out = result.stdout.str()
    assert (
        "neuraldbg: marker @pytest.mark.neuraldbg on test_bad_engine_value: DebugConfig.persistence: "
        "expected an integer between 1 and 1000, got 'x'"
    ) in out
    assert (
        "marker @pytest.mark.neuraldbg on test_misspelt_option: unknown option 'persistance' "
        "(did you mean 'persistence'?); expected preset, steps, gate, baseline, grad_tolerance, fraction_tolerance, "
        "loss_tolerance or a neuraldbg.DebugConfig field: "
    ) in out
    assert (
        "marker @pytest.mark.neuraldbg on test_bad_gate: invalid value 'sometimes' for gate: "
        "expected one of fail, warn, off"
    ) in out
    assert "marker @pytest.mark.neuraldbg on test_positional: takes keyword arguments only" in out


def test_a_misspelt_environment_variable_or_preset_names_the_closest_valid_name(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = usage_error(pytester.runpytest("--neuraldbg-preset=economi"))
    assert "--neuraldbg-preset: invalid value 'economi' (did you mean 'economy'?) for preset: expected" in err
    monkeypatch.setenv("NEURALDBG_PERSISTANCE", "5")
    err = usage_error(pytester.runpytest())
    assert (
        "ERROR: neuraldbg: env NEURALDBG_PERSISTANCE: unknown variable (did you mean 'NEURALDBG_PERSISTENCE'?)" in err
    )


def test_a_misspelt_marker_key_on_a_test_without_the_fixture_fails_that_test(project: pytest.Pytester) -> None:
    """``baselin=True`` would switch the baseline check off unseen: the marker is checked whole on every marked
    test, whether or not it requests the fixture; a right one on such a test changes nothing."""
    project.makepyfile(
        test_markers="""
        import pytest

        @pytest.mark.neuraldbg(baselin=True)
        def test_misspelt():
            pass

        @pytest.mark.neuraldbg(persistence=5)
        def test_right():
            pass
        """
    )
    result = project.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*marker @pytest.mark.neuraldbg on test_misspelt: unknown option 'baselin' (did you mean 'baseline'?)*"]
    )


def test_numbers_and_booleans_in_the_native_toml_table_are_read_as_their_text(project: pytest.Pytester) -> None:
    """pytest 9's ``[tool.pytest]`` keeps TOML's types: ``neuraldbg_steps = 5`` is 5, and a bad one is named as
    from that file."""
    if int(pytest.__version__.split(".")[0]) < 9:
        pytest.skip("the native TOML table is pytest 9's")
    project.makepyfile(
        test_steps="""
        import models

        def test_steps(neuraldbg):
            neuraldbg.smoke_train(models.healthy(), models.data(), models.loss)
            assert neuraldbg.runs[-1].steps == 7
        """
    )
    project.makefile(
        ".toml",
        pyproject="[tool.pytest]\nneuraldbg_steps = 7\nneuraldbg_loss_tolerance = 0.5\n"
        "neuraldbg_update_baselines = false\n",
    )
    project.runpytest().assert_outcomes(passed=1)
    project.makefile(".toml", pyproject="[tool.pytest]\nneuraldbg_steps = -5\n")
    result = project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "ini neuraldbg_steps in pyproject.toml: invalid value '-5' for steps" in result.stderr.str()
