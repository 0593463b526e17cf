"""Hypothesis profiles for the fuzz tests, and the campaign's figures in the terminal summary.

* ``fast`` (the default here, what CI runs): 50 examples per property, derandomized, so every run of the suite
  draws the same models;
* ``long``: ``pytest tests/fuzz --hypothesis-profile=long``, 500 examples per property, also derandomized (its
  figures are those of docs/benchmark.md).

The profiles are registered when this directory's tests are collected, so name ``tests/fuzz`` on the command
line when choosing one.
"""

from __future__ import annotations

import pytest
from fuzz_campaign import CAMPAIGN
from hypothesis import HealthCheck, settings

_COMMON = {
    "derandomize": True,
    "deadline": None,  # a training run takes tens of milliseconds on a quiet core, seconds on a busy one
    "database": None,  # derandomized: nothing to replay
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("fast", max_examples=50, **_COMMON)
settings.register_profile("long", max_examples=500, **_COMMON)


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile("fast")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = CAMPAIGN.summary()
    if lines:
        terminalreporter.section("NeuralDBG fuzzing")
        for line in lines:
            terminalreporter.write_line(line)
