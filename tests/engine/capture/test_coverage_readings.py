"""The coverage takes in every reading a step files, though a step that files none skips them with one test."""

from __future__ import annotations

import copy
import inspect
import re
from dataclasses import asdict
from typing import Any

import pytest

from neuraldbg.capture.coverage import Coverage
from neuraldbg.stats.step import StepData

#: One reading of each kind that only some steps file, as the flush files it.
READINGS: dict[str, Any] = {
    "regression_target": [1.0, 0.0, 3.0, 0.5],
    "target_range": [0.2, 0.01, 0.3],
    "input_range": [[0.1, 0.02, 0.4]],
    "label_prior": [1.5, 64.0, 0.0, 0.0],
    "label_steps": [[7.0, 2.0, 0.6, 1.0]],
    "target_baseline": [0.25, 0.25, 64.0, 0.0, 0.5],
    "loss_options": 9.0,
    "softmax_positives": 2.0,
    "graph_dropout": 0.5,
    "log_prob_gap": 3.0,
    "clamped_outside": 0.4,
    "next_token": 0.9,
    "labels_ahead": 0.8,
    "inverted_masks": {"attention_mask": 1.0},
    "scored_padding": 0.3,
}


def _observed(**fields: Any) -> dict[str, str]:
    """The coverage after one cheap step holding ``fields``, each of its fields by its repr (NaN equal to NaN)."""
    coverage = Coverage()
    coverage.observe(StepData(7, False, loss=1.0, **copy.deepcopy(fields)))
    return {name: _plain(value) for name, value in asdict(coverage).items()}


def _plain(value: Any) -> str:
    """A value as text that two equal values share: an object of a plain class by its attributes, not its address."""
    return repr(sorted(vars(value).items())) if hasattr(value, "__dict__") else repr(value)


@pytest.mark.parametrize("field", sorted(READINGS))
def test_a_cheap_step_holding_one_reading_is_counted_with_it(field: str) -> None:
    blank, read = _observed(), _observed(**{field: READINGS[field]})
    changed = {name for name in read if read[name] != blank[name]}
    assert changed, f"a step that filed {field} left the coverage as a step that filed nothing"


def test_a_step_holding_every_reading_is_counted_as_the_readings_one_by_one() -> None:
    together = _observed(**READINGS)
    blank = _observed()
    for field, value in READINGS.items():
        alone = _observed(**{field: value})
        for name in alone:
            if alone[name] != blank[name]:
                assert together[name] == alone[name], (field, name)


#: Fields :meth:`Coverage._readings` reads only beside another reading the test lets through (and the step's number).
_COMPANIONS = {"step": "every record's", "label_classes": "with label_prior", "baseline_kind": "with target_baseline"}


def test_every_reading_the_coverage_takes_in_is_let_through_by_its_test() -> None:
    """A reading added to ``_readings`` but not to the test in ``observe`` would never be counted."""
    readings = set(re.findall(r"record\.(\w+)", inspect.getsource(Coverage._readings)))
    observe = inspect.getsource(Coverage.observe)
    gate = observe[observe.index("if (\n") : observe.index("self._readings(record)")]
    let_through = set(re.findall(r"record\.(\w+)", gate))
    assert readings - set(_COMPANIONS) == let_through
    assert let_through == set(READINGS)  # and each is tried above
