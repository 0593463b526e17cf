"""What a test ignored (``assert_healthy(ignore=[...])``, the fine-tuning pattern) the gate and the health JUnit
ignore too; a test with ``gate="off"`` is not failed in the health JUnit."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

TESTS = """
import pytest
import torch
import models
from pytest_neuraldbg import assert_healthy


def frozen_first_layer():
    model = models.healthy()
    return model, lambda params: torch.optim.Adam(list(model[2:].parameters()), lr=1e-3)


def test_finetune(neuraldbg):
    model, optimizer = frozen_first_layer()
    ndbg = neuraldbg.smoke_train(model, models.data(), models.loss, steps=30, optimizer=optimizer)
    assert_healthy(ndbg, ignore=["frozen_parameters"])


@pytest.mark.neuraldbg(gate="off")
def test_off(neuraldbg):
    neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=30)


def test_dead(neuraldbg):
    neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=30)
"""


def test_the_gate_and_the_health_junit_ignore_what_the_test_ignored(project: pytest.Pytester) -> None:
    project.makepyfile(test_ignore=TESTS)
    result = project.runpytest("--neuraldbg-gate", "--neuraldbg-junit=health.xml")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_ignore.py::test_dead - NeuralDBG gate*"])
    root = ET.parse(project.path / "health.xml").getroot()
    failing = {
        f"{case.get('classname')}::{case.get('name')}"
        for case in root.iter("testcase")
        if case.find("failure") is not None
    }
    assert failing == {"test_ignore.py::test_dead::dead_neurons"}
    skipped = {
        f"{case.get('classname')}::{case.get('name')}": case.find("skipped").get("message", "")  # type: ignore[union-attr]
        for case in root.iter("testcase")
        if case.find("skipped") is not None
    }
    assert skipped["test_ignore.py::test_finetune::frozen_parameters"].startswith("ignored by the test")
    assert skipped["test_ignore.py::test_off::dead_neurons"].startswith("not gated")
