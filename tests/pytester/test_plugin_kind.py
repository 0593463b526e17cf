"""A failure kind added by a plugin, in one file, fails a test like a built-in kind: under the gate, in the
assertion helpers and in ``assert not ndbg.explain_failure()``; and every report names it: the terminal, the
health JUnit file (a case of its own), summary.md and its Mermaid graph. Also on xdist workers, where the
controller never imported the plugin.

The plugin is the documentation's example, ``examples/zero_output_kind.py``: a layer whose output is exactly zero
(an ``nn.Dropout(p=1.0)`` left in a model).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from integration_support import junit_cases

PLUGIN = (Path(__file__).resolve().parents[2] / "examples" / "zero_output_kind.py").read_text("utf-8")

TESTS = """
import torch
from torch import nn

import zero_output_kind
from pytest_neuraldbg import assert_healthy


def model(p):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(p), nn.Linear(16, 1))


def train(neuraldbg, p):
    net = model(p)
    data = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(4)]
    return neuraldbg.smoke_train(net, data, nn.functional.mse_loss, steps=20, plugins=[zero_output_kind])


def test_healthy(neuraldbg):
    assert not train(neuraldbg, 0.1).explain_failure()


def test_silent(neuraldbg):
    train(neuraldbg, 1.0)


def test_idiom(neuraldbg):
    assert not train(neuraldbg, 1.0).explain_failure()


def test_helper(neuraldbg):
    assert_healthy(train(neuraldbg, 1.0))
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "two-workers"])
def test_a_kind_added_by_a_plugin_file_fails_the_gate_and_every_report_names_it(
    pytester: pytest.Pytester, workers: list[str]
) -> None:
    pytester.makepyfile(zero_output_kind=PLUGIN, test_kind=TESTS)
    args = ["--neuraldbg-gate", "--neuraldbg-junit=health.xml", "--neuraldbg-report=report", *workers]
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(["*NeuralDBG gate: training is unhealthy - zero_output at '2' from step 0*"])
    result.stdout.fnmatch_lines(["*assert not <unhealthy training: zero_output at '2' from step 0*"])
    result.stdout.fnmatch_lines(["*AssertionError: NeuralDBG: training is unhealthy - zero_output at '2'*"])
    result.stdout.fnmatch_lines(["*'2' (Dropout) outputs exactly zero on every sample from step 0*"])
    cases = junit_cases(pytester.path / "health.xml")
    failing = {name for name, case in cases.items() if case.find("failure") is not None}
    assert {f"test_kind.py::{test}::zero_output" for test in ("test_helper", "test_idiom", "test_silent")} <= failing
    assert "test_kind.py::test_healthy::zero_output" in cases  # checked, and passed
    summary = (pytester.path / "report" / "summary.md").read_text("utf-8")
    assert "zero\\_output" in summary and "outputs exactly zero on every sample" in summary
    graphs = list((pytester.path / "report").glob("*.mmd"))
    assert graphs and any("zero_output" in path.read_text("utf-8") for path in graphs)
