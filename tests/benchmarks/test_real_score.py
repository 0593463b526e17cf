"""The real-programs benchmark's scoring: a false alarm on a harmless mutant that names the mutation made is told
apart (counted, never excused), and every other count is unchanged by it; a run that differs from the stored plain
run is NeuralDBG's difference unless a plain run on this machine ends the same."""

from __future__ import annotations

from typing import Any

from benchmarks.real.score import same_run_lines, score


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


def test_a_metric_other_than_the_stored_plain_one_is_not_the_same_run_unless_this_machine_agrees():
    truth = {c: entry(c, "healthy", False, []) for c in ("a.same", "a.machine", "a.changed", "a.unchecked")}
    watched = {"a.same": 0.5, "a.machine": 0.52, "a.changed": 0.61, "a.unchecked": 0.7}
    results = [{"id": c, "metric": m, "error": None} for c, m in watched.items()]
    local = {"a.machine": 0.52, "a.changed": 0.52}  # the plain seed trained here
    lines = same_run_lines(truth, results, local)
    flagged = [line for line in lines if line.startswith("NOT THE SAME RUN")]
    assert [line.split()[4].rstrip(":") for line in flagged] == ["a.changed", "a.unchecked"]
    assert "0.52 plain on this machine" in flagged[0] and "this machine" not in flagged[1]
    assert lines[-1].startswith("1 case(s) ended with another metric than the stored plain run")
    # without plain runs on this machine (a saved run scored again) every difference is flagged
    assert len([line for line in same_run_lines(truth, results) if line.startswith("NOT THE SAME")]) == 3
