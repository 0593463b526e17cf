"""Every setting of the plugin: its flag, ini key and environment variable, help, validator and precedence.

Each setting ``name`` is read from, highest precedence first:

1. the ``@pytest.mark.neuraldbg(name=...)`` marker of the test (``preset``, ``steps``, ``gate``, the baseline
   settings ``baseline``, ``grad_tolerance``, ``fraction_tolerance``, ``loss_tolerance`` and any
   :class:`~neuraldbg.DebugConfig` field; read when the test uses the fixture),
2. the command line flag ``--neuraldbg-<name>``,
3. the environment variable ``NEURALDBG_<NAME>``,
4. the ini key ``neuraldbg_<name>`` (``pytest.ini``, ``tox.ini``, ``setup.cfg`` or ``pyproject.toml``),
5. the default.

A bad value is reported with the value, where it came from and what was expected. This module imports
neither torch nor neuraldbg unless a value needs the engine to be checked.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from neuraldbg.text import printable

from .errors import PluginError

GATES = ("fail", "warn", "off")
KNOWN_PRESETS = ("default", "full", "economy")  # the engine's PRESETS; others are looked up there
DEFAULT_STEPS = 50
DEFAULT_GRAD_TOLERANCE = 10.0  # a gradient norm or update ratio may move by this factor either way
DEFAULT_FRACTION_TOLERANCE = 0.1  # a dead or saturated fraction may rise by this much (absolute)
DEFAULT_LOSS_TOLERANCE = 0.25  # the loss may rise by this fraction of the baseline's loss
MARKER = "neuraldbg"
MARKER_HELP = (
    "neuraldbg(**config): settings for the neuraldbg fixture in this test: preset=, steps= (smoke_train "
    "default), gate= ('fail', 'warn' or 'off'), baseline=True (compare every watched run with the test's "
    "training-health baseline), grad_tolerance=, fraction_tolerance=, loss_tolerance= and any "
    "neuraldbg.DebugConfig field, e.g. persistence=5"
)


class OptionError(PluginError, ValueError):
    """A value that does not parse; the message says what was expected. ``suggestion``: `` (did you mean
    'full'?)`` for a misspelt name, shown right after the value."""

    def __init__(self, message: str, suggestion: str = "") -> None:
        super().__init__(message)
        self.suggestion = suggestion


def _int_between(low: int, high: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise OptionError(f"expected an integer between {low} and {high}")
        try:
            number = int(value) if isinstance(value, int) else int(str(value).strip(), 10)
        except ValueError:
            raise OptionError(f"expected an integer between {low} and {high}") from None
        if not low <= number <= high:
            raise OptionError(f"expected an integer between {low} and {high}")
        return number

    return parse


def parse_gate(value: Any) -> str:
    """``fail``, ``warn`` or ``off`` (case-insensitive; ``true``/``false`` also read as ``fail``/``off``)."""
    text = str(value).strip().lower()
    aliases = {"true": "fail", "1": "fail", "yes": "fail", "on": "fail", "false": "off", "0": "off", "no": "off"}
    text = aliases.get(text, text)
    if text not in GATES:
        raise OptionError(
            "expected one of fail, warn, off (a bare --neuraldbg-gate means fail)", _hint(value, text, GATES)
        )
    return text


def _hint(given: Any, text: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'full'?)`` for the name closest to ``text``, ``given``'s text, or ``""`` (the engine's
    helper, which imports no torch: only on this error path). Only a name given as a string is a misspelling: a
    marker's ``preset=["full"]`` is no spelling of ``full`` (its text would be, and the hint would repeat the
    value it refuses)."""
    if not isinstance(given, str):
        return ""
    from neuraldbg.errors import did_you_mean

    return did_you_mean(text, choices)


def parse_preset(value: Any) -> str:
    """A preset name of the engine: ``default``, ``full`` or ``economy`` (or one a plugin registered)."""
    text = str(value).strip()
    if text in KNOWN_PRESETS:
        return text
    from neuraldbg import PRESETS  # only for an unusual name: importing the engine imports torch

    if text not in PRESETS:
        raise OptionError(f"expected a preset name, one of {', '.join(PRESETS)}", _hint(value, text, PRESETS))
    return text


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_bool(value: Any) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``, ``on``/``off``; case-insensitive) or a bool."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise OptionError("expected true or false (also 1/0, yes/no, on/off)")


def _number(value: Any, expected: str) -> float:
    if isinstance(value, bool):
        raise OptionError(expected)
    try:
        number = float(value) if isinstance(value, (int, float)) else float(str(value).strip())
    except ValueError:
        raise OptionError(expected) from None
    if not math.isfinite(number):
        raise OptionError(expected)
    return number


def parse_factor(value: Any) -> float:
    """A factor greater than 1: ``10`` accepts a value up to 10x larger or smaller than the baseline's."""
    expected = "expected a factor greater than 1, e.g. 10 to accept up to 10x larger or smaller"
    number = _number(value, expected)
    if number <= 1:
        raise OptionError(expected)
    return number


def parse_fraction(value: Any) -> float:
    """An absolute tolerance between 0 and 1 for a fraction of units (``0.1``: ten percentage points)."""
    expected = "expected a number between 0 and 1, e.g. 0.1 to accept ten more percent of dead units"
    number = _number(value, expected)
    if not 0 <= number <= 1:
        raise OptionError(expected)
    return number


def parse_relative(value: Any) -> float:
    """A relative tolerance of at least 0 (``0.25``: up to 25% higher than the baseline's)."""
    expected = "expected a number of at least 0, e.g. 0.25 to accept a loss up to 25% higher"
    number = _number(value, expected)
    if number < 0:
        raise OptionError(expected)
    return number


PICTURES = ("unhealthy", "all", "off")


def parse_pictures(value: Any) -> str:
    """``unhealthy`` (pictures of unhealthy runs), ``all`` (of every run) or ``off``."""
    text = str(value).strip().lower()
    if text not in PICTURES:
        raise OptionError(f"expected one of {', '.join(PICTURES)}", _hint(value, text, PICTURES))
    return text


def parse_path(value: Any) -> str:
    text = str(value).strip()
    if not text:
        raise OptionError("expected a path")
    return text


@dataclass(frozen=True)
class Option:
    """One setting: its names everywhere, its help, and how its text is checked."""

    name: str  # the Settings field and marker keyword; the flag has dashes for underscores
    help: str
    metavar: str
    parse: Callable[[Any], Any]
    bare_value: str | None = None  # the value of the flag given without one (``--neuraldbg-gate``)
    is_path: bool = False
    is_flag: bool = False  # a flag that takes no value (``--neuraldbg-update-baselines``)

    @property
    def flag(self) -> str:
        return "--neuraldbg-" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return "neuraldbg_" + self.name

    @property
    def ini(self) -> str:
        return "neuraldbg_" + self.name

    @property
    def env(self) -> str:
        return "NEURALDBG_" + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option(
        "preset",
        "engine preset for every watched run: default, full (full statistics every step) or economy",
        "NAME",
        parse_preset,
    ),
    Option(
        "persistence",
        "observed steps a state must hold to become a failure event (engine default: 3)",
        "N",
        _int_between(1, 1000),
    ),
    Option(
        "gate",
        "fail (the bare flag, which never takes the next argument), warn or off (given with =): fail every "
        "test whose watched training run is unhealthy, even if the test asserts nothing about it, except for "
        "failures the test itself asserted on and expected; warn reports without failing (default off)",
        "fail|warn|off",
        parse_gate,
        bare_value="fail",
    ),
    Option(
        "report",
        "write a trace (.json), a causal graph (.mmd) per watched run and summary.md (Markdown for "
        "$GITHUB_STEP_SUMMARY or a PR comment) into DIR",
        "DIR",
        parse_path,
        is_path=True,
    ),
    Option(
        "pictures",
        "with --neuraldbg-report: draw pictures of the unhealthy runs (gradient flow over layers and steps, loss, "
        "update ratio; PNG and SVG, linked from summary.md and report.html) with unhealthy, of every run with all, "
        'none with off (default unhealthy; needs matplotlib: pip install "pytest-neuraldbg[plots]")',
        "unhealthy|all|off",
        parse_pictures,
    ),
    Option(
        "junit",
        "write a training-health JUnit XML file to PATH: one test case per watched run and check (and one "
        "per test with a baseline)",
        "PATH",
        parse_path,
        is_path=True,
    ),
    Option(
        "steps",
        f"default number of training steps of neuraldbg.smoke_train() (default {DEFAULT_STEPS})",
        "N",
        _int_between(1, 10_000_000),
    ),
    Option(
        "update_baselines",
        "write or refresh the training-health baselines of the tests that use them (marker baseline=True "
        "or neuraldbg.assert_matches_baseline) instead of comparing; ini and env values: true or false",
        "",
        parse_bool,
        is_flag=True,
    ),
    Option(
        "remove_stale_baselines",
        "delete the stale training-health baselines (files in __neuraldbg__/ of the collected test modules that "
        "no test uses any more) instead of only listing them; ini and env values: true or false",
        "",
        parse_bool,
        is_flag=True,
    ),
    Option(
        "grad_tolerance",
        "baseline comparison: the factor by which a gradient norm or update ratio may differ from the "
        f"baseline's, either way (default {DEFAULT_GRAD_TOLERANCE:g})",
        "FACTOR",
        parse_factor,
    ),
    Option(
        "fraction_tolerance",
        "baseline comparison: how much a dead or saturated fraction may rise above the baseline's, "
        f"absolute (default {DEFAULT_FRACTION_TOLERANCE:g})",
        "DELTA",
        parse_fraction,
    ),
    Option(
        "loss_tolerance",
        "baseline comparison: how much the loss may rise above the baseline's, relative "
        f"(default {DEFAULT_LOSS_TOLERANCE:g})",
        "RATIO",
        parse_relative,
    ),
)
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
#: Settings only a marker sets (no flag, ini key or environment variable).
MARKER_ONLY: dict[str, Option] = {
    "baseline": Option(
        "baseline",
        "compare every run the fixture watched in this test with the test's training-health baseline",
        "BOOL",
        parse_bool,
    ),
}


@dataclass(frozen=True)
class Settings:
    """The resolved settings of a session (or of one test, after its marker)."""

    preset: str | None = None
    persistence: int | None = None
    gate: str = "off"
    report: Path | None = None
    pictures: str = "unhealthy"
    junit: Path | None = None
    steps: int = DEFAULT_STEPS
    update_baselines: bool = False
    remove_stale_baselines: bool = False
    grad_tolerance: float = DEFAULT_GRAD_TOLERANCE
    fraction_tolerance: float = DEFAULT_FRACTION_TOLERANCE
    loss_tolerance: float = DEFAULT_LOSS_TOLERANCE
    baseline: bool = False  # marker only
    sources: Mapping[str, str] = field(default_factory=dict)  # setting name -> where its value came from

    def source(self, name: str) -> str:
        return self.sources.get(name, "default")

    @property
    def writes_files(self) -> bool:
        """Whether the session writes a report file (``--neuraldbg-report`` or ``--neuraldbg-junit``)."""
        return self.report is not None or self.junit is not None


def add_options(parser: pytest.Parser) -> None:
    """Register the ``--neuraldbg-*`` flags and their ini keys."""
    group = parser.getgroup("neuraldbg", "training health (NeuralDBG)")
    for option in OPTIONS:
        text = f"{option.help}. Also ini {option.ini}, env {option.env}."
        if option.is_flag:
            group.addoption(option.flag, dest=option.dest, action="store_const", const="true", help=text)
        elif option.bare_value is not None:
            group.addoption(
                option.flag, dest=option.dest, metavar=option.metavar, nargs="?", const=option.bare_value, help=text
            )
        else:
            group.addoption(option.flag, dest=option.dest, metavar=option.metavar, help=text)
        parser.addini(option.ini, f"{option.help} (like {option.flag})", type="string")


def bare_flags_take_no_value(args: list[str], exists: Callable[[str], bool]) -> None:
    """Rewrite, in place, a bare ``--neuraldbg-gate`` as ``--neuraldbg-gate=fail`` so it never takes the next
    argument: in ``pytest --neuraldbg-gate tests`` the test path stays a test path.

    A value is given with ``=`` only. A bare flag followed by a word that is a value (``--neuraldbg-gate warn``)
    and not an existing path is refused with the spelling that works, rather than run as a test path that is
    not there. Arguments after ``--`` are positional and left alone. ``exists`` tells whether a path exists.
    """
    for option in OPTIONS:
        if option.bare_value is None:
            continue
        for i, arg in enumerate(args):
            if arg == "--":
                break
            if arg != option.flag:
                continue
            following = args[i + 1] if i + 1 < len(args) else None
            if following is not None and following.strip().lower() in GATES and not exists(following):
                raise pytest.UsageError(
                    f"neuraldbg: {option.flag} takes its value after '=': write {option.flag}={following} "
                    f"(a bare {option.flag} means {option.bare_value} and never takes the next argument)"
                )
            args[i] = f"{option.flag}={option.bare_value}"


OVERRIDE = "(-o override)"


def _ini_source(config: pytest.Config, option: Option) -> str:
    overrides = getattr(config.option, "override_ini", None) or []
    if any(str(o).split("=", 1)[0].strip() == option.ini for o in overrides):
        return f"ini {option.ini} {OVERRIDE}"
    where = config.inipath.name if config.inipath is not None else "the configuration"
    return f"ini {option.ini} in {where}"


def lookup(option: Option, cli: Any, env: Mapping[str, str], ini: Any, ini_source: str) -> tuple[Any, str] | None:
    """The raw value with the highest precedence (CLI > env > ini) and its source, or None when unset."""
    if cli is not None:
        return cli, option.flag
    env_value = env.get(option.env, "")
    if env_value.strip():
        return env_value, f"env {option.env}"
    if ini not in (None, "", []):
        return ini, ini_source
    return None


def checked(option: Option, value: Any, source: str) -> Any:
    """Parse ``value``; a bad one raises :class:`OptionError` naming value, source and expectation."""
    try:
        return option.parse(value)
    except OptionError as exc:
        raise OptionError(f"{source}: invalid value {value!r}{exc.suggestion} for {option.name}: {exc}") from None


def resolve(config: pytest.Config, env: Mapping[str, str] | None = None) -> Settings:
    """The session's settings from CLI, environment and ini. Raises :class:`pytest.UsageError` on a bad value."""
    env = os.environ if env is None else env
    try:
        check_environment(env)
        check_ini_keys(config)
    except OptionError as exc:
        raise pytest.UsageError(f"neuraldbg: {exc}") from None
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for option in OPTIONS:
        ini_source = _ini_source(config, option)
        found = lookup(option, config.getoption(option.dest), env, _ini_value(config, option), ini_source)
        if found is None:
            continue
        raw, source = found
        try:
            value = checked(option, raw, source)
        except OptionError as exc:
            raise pytest.UsageError(f"neuraldbg: {exc}") from None
        if option.is_path:
            from_ini = source == ini_source and not source.endswith(OVERRIDE)  # -o is typed where pytest runs
            base = config.inipath.parent if from_ini and config.inipath is not None else config.invocation_params.dir
            value = base / Path(value).expanduser()
            check_output(option, value, source)
        values[option.name] = value
        sources[option.name] = source
    check_outputs_apart(config, values, sources)
    return Settings(**values, sources=sources)


def _ini_value(config: pytest.Config, option: Option) -> Any:
    """The ini value of ``option`` as text. pytest's native TOML table (``[tool.pytest]``, pytest 9) keeps a
    number or a boolean as one, which a key registered as a string refuses (``neuraldbg_steps = 5``): its text is
    parsed instead, like the same value written in quotes. Any other refusal (a list) stays pytest's message."""
    try:
        return config.getini(option.ini)
    except pytest.UsageError:
        entry = (getattr(config, "_inicfg", None) or {}).get(option.ini)
        raw = getattr(entry, "value", None)
        if isinstance(raw, bool):
            return "true" if raw else "false"
        if isinstance(raw, (int, float)):
            return repr(raw)
        raise


#: The files a report folder is given, by name (the runs' own files are named after their tests).
REPORT_FILES = ("summary.md", "report.html")


def check_outputs_apart(config: pytest.Config, values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Two outputs given one path would overwrite each other at the session's end: the JUnit file of
    ``--neuraldbg-junit`` must be neither pytest's own ``--junitxml`` file, nor the report folder, nor one of the
    report folder's files. A usage error now, naming both settings."""
    junit = values.get("junit")
    if junit is None:
        return
    from neuraldbg.export.files import same_file  # only with a JUnit file: the engine's files stay unread otherwise

    shown = printable(str(junit))
    xml = getattr(config.option, "xmlpath", None)
    if xml and same_file(junit, config.invocation_params.dir / Path(xml).expanduser()):
        raise pytest.UsageError(
            f"neuraldbg: {sources['junit']}: {shown} is also pytest's --junitxml file: one would overwrite the "
            "other; give the plugin's JUnit file its own path"
        )
    report = values.get("report")
    if report is not None and any(same_file(junit, there) for there in (report, *(report / f for f in REPORT_FILES))):
        raise pytest.UsageError(
            f"neuraldbg: {sources['junit']}: {shown} is the report folder of {sources['report']} or one of its "
            f"files ({', '.join(REPORT_FILES)}); give the JUnit file a path of its own"
        )


def check_output(option: Option, path: Path, source: str) -> None:
    """An output path that cannot be written is a usage error now, before any test runs (as pytest's own options
    are), not a traceback after the last test: ``--neuraldbg-report`` must be a folder (or be creatable as one),
    ``--neuraldbg-junit`` a regular file in one; the nearest folder that exists must be writable."""
    import stat

    def refuse(problem: str) -> None:
        raise pytest.UsageError(f"neuraldbg: {source}: cannot write {option.name} to {printable(str(path))}: {problem}")

    folder = path if option.name == "report" else path.parent
    if option.name != "report":
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            mode = None
        if mode is not None and stat.S_ISDIR(mode):
            refuse("it is a directory; expected the path of a file")
        if mode is not None and not stat.S_ISREG(mode):
            refuse("it is not a regular file (a device, a FIFO or a link); expected the path of a regular file")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():
            refuse(f"{printable(str(existing))} is a symbolic link to nothing")
        existing = existing.parent
    if not existing.is_dir():
        refuse(f"{printable(str(existing))} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        refuse(f"the folder {printable(str(existing))} is not writable")


def _ini_keys(config: pytest.Config) -> list[str]:
    """The keys of the ini file. pytest has no public listing: ``config.inicfg`` (deprecated in pytest 9, read with
    its warning silenced), else the attribute behind it; none when neither exists."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        found = getattr(config, "inicfg", None)
    if found is None:
        found = getattr(config, "_inicfg", None)
    try:
        return [str(key) for key in found or {}]
    except TypeError:
        return []


def check_ini_keys(config: pytest.Config) -> None:
    """An ini key in the plugin's namespace (``neuraldbg_*``) that names no setting is a typo: :class:`OptionError`
    naming it, its file and the closest key (``neuraldbg_gat`` -> ``neuraldbg_gate``), as for flags and variables."""
    known = [option.ini for option in OPTIONS]
    keys = _ini_keys(config)
    overrides = [str(o).split("=", 1)[0].strip() for o in getattr(config.option, "override_ini", None) or []]
    where = config.inipath.name if config.inipath is not None else "the configuration"
    for key in [*keys, *overrides]:
        if key.lower().startswith("neuraldbg_") and key not in known:
            origin = f"ini {key} (-o override)" if key in overrides else f"ini {key} in {where}"
            raise OptionError(f"{origin}: unknown key{_hint(key, key, known)}; expected one of {', '.join(known)}")


def check_environment(env: Mapping[str, str]) -> None:
    """An environment variable in the plugin's namespace (``NEURALDBG_*``) that names no setting is a typo, not
    a setting of something else: :class:`OptionError` naming it and the closest variable, rather than silence."""
    known = [option.env for option in OPTIONS]
    for name in sorted(env):
        if name.startswith("NEURALDBG_") and name not in known:
            raise OptionError(
                f"env {name}: unknown variable{_hint(name, name, known)}; expected one of {', '.join(known)}"
            )


PLUGIN_MARKER_KEYS = (
    "preset",
    "steps",
    "gate",
    "baseline",
    "grad_tolerance",
    "fraction_tolerance",
    "loss_tolerance",
)
_MARKER_OPTIONS: dict[str, Option] = {o.name: o for o in (*OPTIONS, *MARKER_ONLY.values())}


def marker_source(nodename: str) -> str:
    return f"marker @pytest.mark.{MARKER} on {nodename}"


def apply_marker(base: Settings, kwargs: Mapping[str, Any], nodename: str) -> tuple[Settings, dict[str, Any]]:
    """Settings after a test's marker, and the marker's engine options (DebugConfig fields, unchecked here).

    Raises :class:`OptionError` naming the marker and the test for a bad plugin setting.
    """
    source = marker_source(nodename)
    changes: dict[str, Any] = {}
    sources = dict(base.sources)
    engine: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in PLUGIN_MARKER_KEYS:
            changes[key] = checked(_MARKER_OPTIONS[key], value, source)
            sources[key] = source
        else:
            engine[key] = value
    if "persistence" in engine:
        sources["persistence"] = source
    return replace(base, **changes, sources=sources), engine


def marker_kwargs(item: pytest.Item) -> dict[str, Any]:
    """The keyword arguments of every ``neuraldbg`` marker on the item; the closest marker wins per key."""
    merged: dict[str, Any] = {}
    for mark in reversed(list(item.iter_markers(MARKER))):  # farthest (module) first, the test's own last
        if mark.args:
            raise OptionError(
                f"{marker_source(item.name)}: takes keyword arguments only (e.g. persistence=5), "
                f"got positional {mark.args!r}"
            )
        merged.update(mark.kwargs)
    return merged
