"""No layer name can crash the end of a session or hide a test's outcome, with or without xdist."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

TESTS = """
import collections
import torch
from torch import nn
import models


def named(relu):
    torch.manual_seed(0)
    model = nn.Sequential(collections.OrderedDict(
        [("fc1", nn.Linear(8, 16)), (relu, nn.ReLU()), ("fc2", nn.Linear(16, 1))]
    ))
    with torch.no_grad():
        model.fc1.bias.fill_(-20.0)
    return model


def test_surrogate(neuraldbg):
    neuraldbg.smoke_train(named("relu\\udc80"), models.data(), models.loss, steps=12)


def test_escape(neuraldbg):
    neuraldbg.smoke_train(named("\\x1b[1A\\x1b[2Kall healthy\\u202e"), models.data(), models.loss, steps=12)


def test_fine():
    assert True
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_a_hostile_layer_name_is_reported_and_its_test_still_fails(
    project: pytest.Pytester, workers: list[str]
) -> None:
    if workers:
        pytest.importorskip("xdist")
    project.makepyfile(test_names=TESTS)
    result = project.runpytest_subprocess(
        "--neuraldbg-gate",
        "--neuraldbg-report=report",
        "--neuraldbg-junit=health.xml",
        "--junitxml=junit.xml",
        "-p",
        "no:cacheprovider",
        *workers,
    )
    result.assert_outcomes(failed=2, passed=1)
    out = result.stdout.str()
    assert "\x1b[1A" not in out and "\u202e" not in out
    assert "relu\\udc80" in out and "\\x1b[1A\\x1b[2Kall healthy\\u202e" in out
    summary = (project.path / "report" / "summary.md").read_text("utf-8")
    assert "relu\\\\udc80" in summary and "\x1b" not in summary
    for xml in ("health.xml", "junit.xml"):
        root = ET.parse(project.path / xml).getroot()
        assert root.iter("testcase")
    assert all((project.path / "report" / name).stat().st_size > 0 for name in ("summary.md",))
