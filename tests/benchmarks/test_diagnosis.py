"""The fast subset of the public diagnosis benchmark: every scenario in it must be diagnosed correctly.

The full benchmark is ``python -m benchmarks.diagnosis``; its table is in the README.
"""

from __future__ import annotations

import pytest

from benchmarks.diagnosis import FAST, Result, report, run
from benchmarks.scenarios import get


@pytest.fixture(scope="module")
def results() -> dict[str, Result]:
    return {name: run(get(name)) for name in FAST}


@pytest.mark.parametrize("name", FAST)
def test_the_scenario_is_diagnosed_as_its_ground_truth_says(results: dict[str, Result], name: str):
    result = results[name]
    summary = "; ".join(h.summary() for h in result.hypotheses) or "healthy"
    assert result.correct, f"{name}: expected {sorted(result.truth.kinds) or 'healthy'}, got {summary}"


def test_the_fast_subset_covers_every_kind_and_hard_healthy_runs(results: dict[str, Result]):
    kinds = set().union(*(r.truth.kinds for r in results.values()))
    assert len(kinds) == 7
    assert sum(r.truth.healthy for r in results.values()) >= 5


def test_the_report_meets_the_targets(results: dict[str, Result]):
    text, ok = report(list(results.values()))
    assert ok, text
    assert "detection recall | 1.00" in text
