"""TrainingFacts reads stretches of a run by its steps: fully observed steps are dense at the start of a run (every
step of the first 16, then every 16th), so the rows are not evenly spread over the steps."""

from __future__ import annotations

import math
import statistics

from neuraldbg.stats.training import Row, TrainingFacts


def facts(steps: list[int], ratios: list[float]) -> TrainingFacts:
    found = TrainingFacts()
    found.rows = [Row(s, r, 1.0, 1.0, 1.0, math.nan, 0.1, True) for s, r in zip(steps, ratios)]
    return found


def dense_then_sparse() -> TrainingFacts:
    """A 300-step run: rows at every step of the first 16 (ratio 1.0), then every 16th step (ratio 0.01)."""
    steps = [*range(17), *range(32, 300, 16)]
    return facts(steps, [1.0 if s <= 16 else 0.01 for s in steps])


def test_a_stretch_of_the_run_is_read_by_its_steps_not_by_its_rows():
    run = dense_then_sparse()
    a, b = run.between(0.0, 0.25)  # steps 0-72: the 17 dense rows and the rows of steps 32, 48, 64
    assert [r.step for r in run.rows[a:b]] == [*range(17), 32, 48, 64]
    # each row stands for the steps until the next: the dense rows (1.0) for 32 steps (row 16 for steps 16-31),
    # the three others (0.01) for 48; read by rows, 17 of 20 would say 1.0
    assert run.median("update_ratio", 0.0, 0.25) == 0.01
    assert run.quantile("update_ratio", 0.55, 0.0, 0.25) == 0.01
    assert run.quantile("update_ratio", 0.65, 0.0, 0.25) == 1.0
    assert run.median("update_ratio", 0.5, 1.0) == 0.01


def test_a_quantile_of_rows_one_step_apart_is_the_plain_one():
    values = [0.3, 0.1, 0.4, 0.2, 0.5, 0.9]
    run = facts(list(range(len(values))), values)
    assert run.median("update_ratio") == statistics.median(values)
    assert run.quantile("update_ratio", 1.0) == 0.9
    assert run.quantile("update_ratio", 0.0) == 0.1


def test_no_rows_or_no_finite_value_is_nan_and_a_window_holds_one_row_at_least():
    assert math.isnan(TrainingFacts().median("update_ratio"))
    assert math.isnan(facts([0, 1], [math.nan, math.nan]).median("update_ratio"))
    run = facts([0, 100], [0.5, 0.7])
    assert run.between(0.4, 0.45) == (1, 2)  # no row in steps 40-45: the next one
    assert run.median("update_ratio", 0.4, 0.45) == 0.7
