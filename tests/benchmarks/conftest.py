"""The benchmark tests import ``benchmarks`` from the repository root, which is not an installed package."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: a benchmark scenario that takes more than ~0.5 s to measure on 2 cores")
