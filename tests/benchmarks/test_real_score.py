"""The real-programs benchmark's scoring: a false alarm on a harmless mutant that names the mutation made is told
apart (counted, never excused), and every other count is unchanged by it."""

from __future__ import annotations

from typing import Any

from benchmarks.real.score import score


def entry(case: str, variant: str, harmful: bool, hand: list[str]) -> dict[str, Any]:
    return {
        "id": case,
        "variant": variant,
        "harmful": harmful,
        "operator": "zero_grad",
        "kinds": hand,
        "hand_kinds": hand,
        "root": None,
        "reasons": [],
        "evidence": {"metric": [0.5], "twin_mean": 0.9, "higher_is_better": True, "margin": 0.03},
    }


def result(case: str, *kinds: str) -> dict[str, Any]:
    return {"id": case, "hypotheses": [{"kind": k, "layer": "", "summary": k} for k in kinds]}


def test_an_alarm_that_names_the_harmless_mutation_is_a_false_alarm_told_apart():
    truth = {
        "a.healthy": entry("a.healthy", "healthy", False, []),
        "a.no_zero_grad": entry("a.no_zero_grad", "no_zero_grad", False, ["gradients_not_zeroed"]),
        "a.batch_8": entry("a.batch_8", "batch_8", False, ["loss_not_decreasing"]),
        "a.lr": entry("a.lr", "lr", True, ["unstable_loss"]),
    }
    results = [
        result("a.healthy", "gradients_not_zeroed"),
        result("a.no_zero_grad", "gradients_not_zeroed"),
        result("a.batch_8", "dead_neurons"),
        result("a.lr", "unstable_loss"),
    ]
    s = score(truth, results)
    assert s["healthy"] == [1, 1]
    assert s["harmless"] == [2, 2]  # both harmless alarms stay false alarms
    assert s["harmless_named"] == [1, 2]  # one of them names the mutation made
    assert s["false_alarms"] == [3, 3]
    assert s["recall"] == [1, 1] and s["right_kind"] == [1, 1]
