"""``@pytest.mark.neuraldbg(...)`` and the precedence marker > CLI > environment > ini > default."""

from __future__ import annotations

import re

import pytest

import neuraldbg

PRINTS_SETTINGS = """
import models
import pytest

{marker}
def test_settings(neuraldbg):
    ndbg = neuraldbg({call})
    print("PERSISTENCE", ndbg.config.persistence, "FULL_EVERY", ndbg.config.full_every)
    print("STEPS", neuraldbg.smoke_train(models.healthy(), models.data(), models.loss).steps)
"""


def settings_of(
    project: pytest.Pytester, *args: str, ini: str = "", marker: str = "", call: str = "models.healthy()"
) -> list[str]:
    if ini:
        project.makeini("[pytest]\n" + ini)
    project.makepyfile(test_settings=PRINTS_SETTINGS.format(marker=marker, call=call))
    result = project.runpytest("-s", *args)
    result.assert_outcomes(passed=1)
    return re.findall(r"PERSISTENCE \d+ FULL_EVERY \d+|STEPS \d+", result.stdout.str())


DEFAULT_PERSISTENCE = neuraldbg.DebugConfig().persistence


@pytest.mark.parametrize(
    ("ini", "env", "cli", "marker", "call", "expected"),
    [
        (None, None, None, None, None, DEFAULT_PERSISTENCE),
        ("4", None, None, None, None, 4),
        ("4", "5", None, None, None, 5),
        ("4", "5", "6", None, None, 6),
        ("4", "5", "6", "7", None, 7),
        ("4", "5", "6", "7", "8", 8),
    ],
    ids=["default", "ini", "env-over-ini", "cli-over-env", "marker-over-cli", "call-over-marker"],
)
def test_persistence_follows_the_precedence_order(
    project: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    ini: str | None,
    env: str | None,
    cli: str | None,
    marker: str | None,
    call: str | None,
    expected: int,
) -> None:
    if env is not None:
        monkeypatch.setenv("NEURALDBG_PERSISTENCE", env)
    lines = settings_of(
        project,
        *([f"--neuraldbg-persistence={cli}"] if cli else []),
        ini=f"neuraldbg_persistence = {ini}\n" if ini else "",
        marker=f"@pytest.mark.neuraldbg(persistence={marker})" if marker else "",
        call=f"models.healthy(), persistence={call}" if call else "models.healthy()",
    )
    assert lines[0].startswith(f"PERSISTENCE {expected} ")


def test_steps_and_preset_from_the_marker_beat_the_command_line(project: pytest.Pytester) -> None:
    lines = settings_of(
        project,
        "--neuraldbg-steps=9",
        "--neuraldbg-preset=economy",
        marker='@pytest.mark.neuraldbg(steps=5, preset="full")',
    )
    assert lines == [f"PERSISTENCE {DEFAULT_PERSISTENCE} FULL_EVERY 1", "STEPS 5"]


def test_the_preset_comes_from_the_ini_file_when_nothing_else_sets_it(project: pytest.Pytester) -> None:
    lines = settings_of(project, ini="neuraldbg_preset = full\nneuraldbg_steps = 4\n")
    assert lines == [f"PERSISTENCE {DEFAULT_PERSISTENCE} FULL_EVERY 1", "STEPS 4"]


def test_the_closest_marker_wins_and_class_markers_apply_to_methods(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_classes="""
        import models
        import pytest

        pytestmark = pytest.mark.neuraldbg(persistence=2, full_every=4)

        @pytest.mark.neuraldbg(persistence=5)
        class TestIt:
            def test_class_marker(self, neuraldbg):
                config = neuraldbg(models.healthy()).config
                assert (config.persistence, config.full_every) == (5, 4)

            @pytest.mark.neuraldbg(persistence=6)
            def test_own_marker(self, neuraldbg):
                assert neuraldbg(models.healthy()).config.persistence == 6
        """
    )
    project.runpytest().assert_outcomes(passed=2)


def test_the_marker_is_registered_for_strict_markers(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_strict="""
        import pytest

        @pytest.mark.neuraldbg(gate="off")
        def test_marked():
            pass
        """
    )
    result = project.runpytest("--strict-markers", "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.neuraldbg(**config): settings for the neuraldbg fixture*"])
    project.runpytest("--strict-markers").assert_outcomes(passed=1)
