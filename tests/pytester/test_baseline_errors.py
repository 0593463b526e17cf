"""Baselines that cannot be written or are not baselines fail their test with one message and no traceback, and a
layer name that holds terminal escapes reaches every baseline text as visible escapes."""

from __future__ import annotations

import pytest
from integration_support import junit_cases, properties

UPDATE = "--neuraldbg-update-baselines"

#: Three baseline tests with one tiny smoke run each; SCALE multiplies the data (1000: every gradient regresses).
#: HOSTILE names the first layer of test_named.
TESTS = """
import collections
import os

import models
import pytest
import torch
from torch import nn

HOSTILE = "fc\\x1b[2K\\x1b[32mPASSED\\x1b[0m\\u202e"


def run(neuraldbg, first="0"):
    torch.manual_seed(0)
    model = nn.Sequential(collections.OrderedDict(
        [(first, nn.Linear(8, 16)), ("relu", nn.ReLU()), ("out", nn.Linear(16, 1))]
    ))
    scale = float(os.environ.get("SCALE", "1"))
    neuraldbg.smoke_train(model, [(x * scale, y) for x, y in models.data()], models.loss, steps=5)


@pytest.mark.neuraldbg(baseline=True)
def test_folder(neuraldbg):
    run(neuraldbg)


@pytest.mark.neuraldbg(baseline=True)
def test_link(neuraldbg):
    run(neuraldbg)


@pytest.mark.neuraldbg(baseline=True)
def test_named(neuraldbg):
    run(neuraldbg, HOSTILE)
"""

SHOWN = "fc\\x1b[2K\\x1b[32mPASSED\\x1b[0m\\u202e"


@pytest.fixture
def baselines(project: pytest.Pytester) -> pytest.Pytester:
    project.makepyfile(test_runs=TESTS)
    return project


def no_internal_traceback(result: pytest.RunResult) -> None:
    out = result.stdout.str()
    for internal in ("Traceback", "baseline/files.py", "baseline/check.py", "BaselineError", "OutputError"):
        assert internal not in out


def test_a_baseline_that_cannot_be_written_fails_its_test_with_the_file_and_what_is_in_the_way(
    baselines: pytest.Pytester,
) -> None:
    folder = baselines.path / "__neuraldbg__" / "test_runs"
    (folder / "test_folder.json").mkdir(parents=True)
    (folder / "test_link.json").symlink_to(baselines.path / "elsewhere.json")
    baselines.makepyfile(
        test_other="import pytest\nfrom test_runs import run\n\n\n"
        "@pytest.mark.neuraldbg(baseline=True)\ndef test_it(neuraldbg):\n    run(neuraldbg)\n"
    )
    (baselines.path / "__neuraldbg__" / "test_other").write_text("", "utf-8")  # a file where its folder goes
    result = baselines.runpytest(UPDATE, "-p", "no:cacheprovider", "--junitxml=junit.xml", "-k", "not named")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "*_ test_folder _*",
            "NeuralDBG baseline __neuraldbg__/test_runs/test_folder.json is a directory; expected the path of a "
            "regular file to write",
            "",
            "Nothing was written. NeuralDBG writes a regular file there, creating its folders: remove or rename what "
            "is in the way (or make the folder writable), then write it again and review the diff:",
            "  pytest --neuraldbg-update-baselines test_runs.py::test_folder",
        ]
    )
    result.stdout.fnmatch_lines(
        ["*_ test_link _*", "NeuralDBG baseline __neuraldbg__/test_runs/test_link.json is a symbolic link; *"]
    )
    result.stdout.fnmatch_lines(
        [
            "NeuralDBG baseline __neuraldbg__/test_other/test_it.json cannot be written: Not a directory",
            "baselines: 3 invalid",
        ]
    )
    no_internal_traceback(result)
    assert not (baselines.path / "elsewhere.json").exists()
    case = junit_cases(baselines.path / "junit.xml")["test_runs::test_folder"]
    assert ("neuraldbg.baseline", "invalid: __neuraldbg__/test_runs/test_folder.json") in properties(case)


def test_a_baseline_holding_json_null_is_not_a_baseline_rather_than_missing(baselines: pytest.Pytester) -> None:
    folder = baselines.path / "__neuraldbg__" / "test_runs"
    folder.mkdir(parents=True)
    (folder / "test_folder.json").write_text("null\n", "utf-8")
    result = baselines.runpytest("-p", "no:cacheprovider", "-k", "folder")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "NeuralDBG baseline __neuraldbg__/test_runs/test_folder.json is not a NeuralDBG baseline: expected an "
            "object with \"format\": 'pytest-neuraldbg baseline', got null",
            "",
            "Fix the file, or write it again from this run with --neuraldbg-update-baselines and review the diff:",
            "baselines: 1 invalid",
        ]
    )
    assert "does not exist" not in result.stdout.str()
    no_internal_traceback(result)


def test_a_regression_at_a_layer_named_with_escapes_shows_the_name_escaped_everywhere(
    baselines: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    baselines.runpytest(UPDATE, "-p", "no:cacheprovider", "-k", "named").assert_outcomes(passed=1)
    monkeypatch.setenv("SCALE", "1000")
    args = ("-p", "no:cacheprovider", "-k", "named", "--junitxml=junit.xml", "--neuraldbg-junit=health.xml")
    result = baselines.runpytest(*args)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "\x1b" not in out and "\u202e" not in out
    result.stdout.fnmatch_lines(["metric * layer * point *", f"grad_norm * {SHOWN} * x10"])
    for name in ("junit.xml", "health.xml"):
        text = (baselines.path / name).read_text("utf-8")
        assert "\u202e" not in text and "\x1b" not in text and "#x1B" not in text and SHOWN in text
