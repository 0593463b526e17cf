"""Option parsing and precedence, without running pytest inside pytest."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import support
import torch.nn.functional as F

import neuraldbg
from pytest_neuraldbg import options
from pytest_neuraldbg.options import BY_NAME, OptionError, Settings


class FakeConfig:
    """The part of pytest.Config that ``options.resolve`` reads."""

    def __init__(self, cli: dict[str, Any] | None = None, ini: dict[str, str] | None = None, overrides=()) -> None:
        self.cli = cli or {}
        self.ini = ini or {}
        self.inipath = Path("/project/pytest.ini")
        self.invocation_params = SimpleNamespace(dir=Path("/cwd"))
        self.option = SimpleNamespace(override_ini=list(overrides))

    def getoption(self, dest: str) -> Any:
        return self.cli.get(dest)

    def getini(self, name: str) -> str:
        return self.ini.get(name, "")


def test_every_option_has_a_flag_an_ini_key_and_an_environment_variable() -> None:
    names = {o.name: (o.flag, o.ini, o.env) for o in options.OPTIONS}
    assert names["persistence"] == ("--neuraldbg-persistence", "neuraldbg_persistence", "NEURALDBG_PERSISTENCE")
    assert names["grad_tolerance"] == (
        "--neuraldbg-grad-tolerance",
        "neuraldbg_grad_tolerance",
        "NEURALDBG_GRAD_TOLERANCE",
    )
    assert set(names) == {
        *("preset", "persistence", "gate", "report", "pictures", "junit", "steps"),
        *("update_baselines", "remove_stale_baselines", "grad_tolerance", "fraction_tolerance", "loss_tolerance"),
    }


def test_defaults_apply_when_nothing_is_set() -> None:
    settings = options.resolve(FakeConfig(), env={})
    assert settings == Settings(sources={})
    assert (settings.gate, settings.steps, settings.report, settings.source("gate")) == ("off", 50, None, "default")


@pytest.mark.parametrize(
    ("cli", "env", "ini", "expected"),
    [
        (None, None, "4", (4, "ini neuraldbg_persistence in pytest.ini")),
        (None, "5", "4", (5, "env NEURALDBG_PERSISTENCE")),
        ("6", "5", "4", (6, "--neuraldbg-persistence")),
        (None, "  ", "4", (4, "ini neuraldbg_persistence in pytest.ini")),  # a blank variable is unset
    ],
)
def test_the_command_line_beats_the_environment_which_beats_the_ini_file(
    cli: str | None, env: str | None, ini: str, expected: tuple[int, str]
) -> None:
    config = FakeConfig({"neuraldbg_persistence": cli}, {"neuraldbg_persistence": ini})
    settings = options.resolve(config, env={"NEURALDBG_PERSISTENCE": env} if env is not None else {})
    assert (settings.persistence, settings.source("persistence")) == expected


def test_paths_from_the_ini_file_are_relative_to_it_and_others_to_the_invocation_directory() -> None:
    config = FakeConfig({"neuraldbg_junit": "health.xml"}, {"neuraldbg_report": "reports"})
    settings = options.resolve(config, env={})
    assert settings.report == Path("/project/reports")
    assert settings.junit == Path("/cwd/health.xml")
    overridden = FakeConfig(ini={"neuraldbg_report": "reports"}, overrides=["neuraldbg_report=reports"])
    assert options.resolve(overridden, env={}).report == Path("/cwd/reports")


def test_a_bad_value_is_a_usage_error_naming_value_source_and_expectation() -> None:
    with pytest.raises(pytest.UsageError) as info:
        options.resolve(FakeConfig(), env={"NEURALDBG_GATE": "loud"})
    assert str(info.value).startswith("neuraldbg: env NEURALDBG_GATE: invalid value 'loud' for gate: expected one of")
    with pytest.raises(pytest.UsageError, match=r"ini neuraldbg_steps \(-o override\): invalid value '-1'"):
        options.resolve(FakeConfig(ini={"neuraldbg_steps": "-1"}, overrides=["neuraldbg_steps=-1"]), env={})


@pytest.mark.parametrize(
    ("text", "gate"), [("fail", "fail"), ("WARN", "warn"), (" off ", "off"), ("true", "fail"), ("0", "off")]
)
def test_gate_values_are_read_leniently(text: str, gate: str) -> None:
    assert options.parse_gate(text) == gate


@pytest.mark.parametrize("bad", ["", "1.5", "0", "1001", True, "ten"])
def test_persistence_must_be_an_integer_in_the_engine_range(bad: object) -> None:
    with pytest.raises(OptionError, match="expected an integer between 1 and 1000"):
        BY_NAME["persistence"].parse(bad)


def test_known_presets_are_the_engines_and_a_preset_registered_later_is_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert set(options.KNOWN_PRESETS) == set(neuraldbg.PRESETS)
    monkeypatch.setitem(neuraldbg.PRESETS, "tiny", neuraldbg.DebugConfig(persistence=1))
    assert options.parse_preset("tiny") == "tiny"
    with pytest.raises(OptionError, match="expected a preset name, one of default, full, economy, tiny"):
        options.parse_preset("huge")


def test_a_marker_overrides_plugin_settings_and_passes_engine_options_through() -> None:
    base = Settings(gate="fail", steps=50, sources={"gate": "--neuraldbg-gate"})
    settings, engine = options.apply_marker(base, {"gate": "off", "steps": "7", "full_every": 2}, "test_x")
    assert (settings.gate, settings.steps, engine) == ("off", 7, {"full_every": 2})
    assert settings.source("gate") == "marker @pytest.mark.neuraldbg on test_x"
    with pytest.raises(OptionError, match=r"marker @pytest.mark.neuraldbg on test_x: invalid value 0 for steps"):
        options.apply_marker(base, {"steps": 0}, "test_x")


def rewritten(*args: str, existing: tuple[str, ...] = ()) -> list[str]:
    out = list(args)
    options.bare_flags_take_no_value(out, lambda path: path in existing)
    return out


def test_a_bare_gate_flag_is_rewritten_so_it_never_takes_the_next_argument() -> None:
    assert rewritten("--neuraldbg-gate", "tests") == ["--neuraldbg-gate=fail", "tests"]
    assert rewritten("tests", "--neuraldbg-gate") == ["tests", "--neuraldbg-gate=fail"]
    assert rewritten("--neuraldbg-gate=warn", "tests") == ["--neuraldbg-gate=warn", "tests"]
    assert rewritten("-x", "--", "--neuraldbg-gate") == ["-x", "--", "--neuraldbg-gate"]  # after --: a path
    assert rewritten("--neuraldbg-gate", "off", existing=("off",)) == ["--neuraldbg-gate=fail", "off"]  # a folder
    with pytest.raises(pytest.UsageError, match="write --neuraldbg-gate=warn"):
        rewritten("--neuraldbg-gate", "warn")


def test_a_misspelt_preset_or_gate_names_the_closest_value_wherever_it_was_set() -> None:
    with pytest.raises(pytest.UsageError) as info:
        options.resolve(FakeConfig({"neuraldbg_preset": "ful"}), env={})
    assert str(info.value).startswith(
        "neuraldbg: --neuraldbg-preset: invalid value 'ful' (did you mean 'full'?) for preset: expected a preset name"
    )
    with pytest.raises(pytest.UsageError, match=r"env NEURALDBG_GATE: invalid value 'wran' \(did you mean 'warn'\?\)"):
        options.resolve(FakeConfig(), env={"NEURALDBG_GATE": "wran"})
    with pytest.raises(OptionError, match=r"on test_x: invalid value 'econmy' \(did you mean 'economy'\?\) for preset"):
        options.apply_marker(Settings(), {"preset": "econmy"}, "test_x")
    with pytest.raises(OptionError, match=r"invalid value 'turbo' for preset: expected a preset name, one of default"):
        options.apply_marker(Settings(), {"preset": "turbo"}, "test_x")  # nothing close: the list alone


@pytest.mark.parametrize(("key", "value"), [("preset", ["full"]), ("gate", ("warn",)), ("pictures", ["all"])])
def test_a_marker_value_of_the_wrong_type_gets_no_hint_that_repeats_it(key: str, value: object) -> None:
    """``preset=["full"]`` is no misspelling of ``full``: the message says what was expected, with no "did you
    mean 'full'" beside the value it refuses."""
    with pytest.raises(OptionError) as info:
        options.checked(BY_NAME[key], value, "marker")
    assert f"invalid value {value!r} for {key}: expected" in str(info.value)
    assert "did you mean" not in str(info.value)


def test_a_misspelt_neuraldbg_environment_variable_is_a_usage_error_naming_the_closest_variable() -> None:
    with pytest.raises(pytest.UsageError) as info:
        options.resolve(FakeConfig(), env={"NEURALDBG_PERSISTANCE": "5", "PATH": "/bin"})
    assert str(info.value).startswith(
        "neuraldbg: env NEURALDBG_PERSISTANCE: unknown variable (did you mean 'NEURALDBG_PERSISTENCE'?); "
        "expected one of NEURALDBG_PRESET, NEURALDBG_PERSISTENCE,"
    )
    assert options.resolve(FakeConfig(), env={"NEURALDBG_PERSISTENCE": "5", "OTHER_TOOL": "x"}).persistence == 5


FIXTURE_TYPOS = {
    "call": (
        lambda fx: fx(support.mlp(), persistance=3),
        "neuraldbg(): unknown option 'persistance' (did you mean 'persistence'?); expected model, config, preset",
    ),
    "call preset": (
        lambda fx: fx(support.mlp(), preset="ful"),
        "neuraldbg(): unknown preset 'ful' (did you mean 'full'?); expected one of default, full, economy",
    ),
    "call config": (
        lambda fx: fx(support.mlp(), {"persistance": 3}),
        "neuraldbg(): config: unknown option 'persistance' (did you mean 'persistence'?); expected a DebugConfig",
    ),
    "smoke_train": (
        lambda fx: fx.smoke_train(support.mlp(), support.regression_batches(), F.mse_loss, dead_fraction=0.5),
        "neuraldbg.smoke_train(): unknown option 'dead_fraction' (did you mean 'dead_unit_fraction'?); expected "
        "model, data, loss_fn, optimizer, steps,",
    ),
    "smoke_train keyword": (
        lambda fx: fx.smoke_train(support.mlp(), support.regression_batches(), F.mse_loss, overfitt=True),
        "neuraldbg.smoke_train(): unknown option 'overfitt' (did you mean 'overfit'?)",
    ),
}


@pytest.mark.parametrize("case", sorted(FIXTURE_TYPOS))
def test_a_misspelt_option_of_the_fixture_names_the_call_and_the_closest_valid_name(case: str) -> None:
    from pytest_neuraldbg.fixture import NeuralDbgFixture

    call, message = FIXTURE_TYPOS[case]
    fixture = NeuralDbgFixture(Settings())
    with pytest.raises(neuraldbg.ConfigError) as info:
        call(fixture)
    assert str(info.value).startswith(message), str(info.value)
    assert fixture.runs == []  # nothing was watched


def test_the_engines_own_keywords_pass_through_the_fixture_untouched() -> None:
    from pytest_neuraldbg.fixture import NeuralDbgFixture

    fixture = NeuralDbgFixture(Settings())
    dbg = fixture(support.mlp(), gather=False, gather_timeout=5.0, persistence=4)
    assert dbg.config.persistence == 4 and fixture.runs == [dbg]
