"""The real-programs benchmark's ground-truth rule: what makes a mutant harmful, decided from plain-torch runs."""

from __future__ import annotations

from typing import Any

from benchmarks.real.core import Case, Program, Variant, healthy
from benchmarks.real.truth import decide


def _run(metric: float) -> dict[str, Any]:
    return {
        "metric": metric,
        "loss_first": 2.3,
        "loss_final": 0.4,
        "loss_nonfinite": False,
        "steps": 50,
        "seconds": 0.1,
        "error": "",
        "probe": {},
    }


def _case(operator: str) -> Case:
    mutant = Variant("mutant", operator, "a change", {"flag": True}, frozenset({"gradients_not_zeroed"}))
    program = Program(
        family="f",
        name="p",
        train=lambda hp, session: {"metric": 0.0},
        defaults={"flag": False},
        metric="accuracy",
        higher_is_better=True,
        floor=0.03,
        chance=0.1,
        variants=(healthy("the program"), mutant),
    )
    return Case(program, mutant)


TWIN = [_run(0.90), _run(0.91), _run(0.89)]
AS_GOOD = [_run(0.91), _run(0.90), _run(0.90)]


def test_a_mutant_that_trains_as_well_as_its_twin_is_harmless() -> None:
    entry = decide(_case("learning_rate"), AS_GOOD, TWIN)
    assert not entry["harmful"] and entry["reasons"] == [] and entry["kinds"] == []


def test_a_missing_zero_grad_is_harmful_whatever_the_metric_shows() -> None:
    # issue 17: a missing zero_grad() must be found whatever the loss does, so its mutant is a fault even where
    # it happens to train as well as its twin (the tiny BERT under Adam)
    entry = decide(_case("zero_grad"), AS_GOOD, TWIN)
    assert entry["harmful"]
    assert entry["reasons"] == ["optimizer.zero_grad() missing: a defect by definition, whatever the metric shows"]
    assert entry["kinds"] == ["gradients_not_zeroed"]


def test_a_defect_that_also_harms_the_metric_keeps_the_measured_reason_alone() -> None:
    entry = decide(_case("zero_grad"), [_run(0.5), _run(0.5), _run(0.5)], TWIN)
    assert entry["harmful"] and len(entry["reasons"]) == 1 and "worse by" in entry["reasons"][0]
