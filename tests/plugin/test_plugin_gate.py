"""The gate's failure text, alone and together with a baseline check's failure."""

from __future__ import annotations

from pytest_neuraldbg import gate


def unhealthy(*summaries: str) -> dict:
    hypotheses = [{"summary": s, "explanation": f"Because {s}.", "chain": []} for s in summaries]
    return {"verdict": "unhealthy", "hypotheses": hypotheses}


HINT = (
    "Failed by the NeuralDBG gate (gate=fail from env NEURALDBG_GATE). For a test that trains a broken model on "
    "purpose, assert on the failure it expects (with pytest.raises(AssertionError): assert_no_dead_neurons(ndbg)) "
    'or use @pytest.mark.neuraldbg(gate="off").'
)


def test_the_gate_text_is_the_verdict_line_then_every_explanation_then_how_to_turn_it_off() -> None:
    text = gate.gate_text([unhealthy("a at '1'"), unhealthy("b at '2'")], "env NEURALDBG_GATE")
    assert text.split("\n\n") == [
        "NeuralDBG gate: training is unhealthy - 2 failure hypotheses: a at '1'; b at '2'",
        "1. a at '1'\nBecause a at '1'.\nCausal chain (root first):",
        "2. b at '2'\nBecause b at '2'.\nCausal chain (root first):",
        HINT,
    ]


def test_explanations_another_failure_already_gives_are_not_repeated() -> None:
    other = "NeuralDBG baseline regression: new failure\n\ndiagnosis: Because a at '1'."
    assert gate.gate_text([unhealthy("a at '1'")], "env NEURALDBG_GATE", other).split("\n\n") == [
        "NeuralDBG gate: training is unhealthy - a at '1'",
        HINT,
    ]
    partly = gate.gate_text([unhealthy("a at '1'", "b at '2'")], "env NEURALDBG_GATE", other)
    assert "Because a at '1'." in partly and "Because b at '2'." in partly  # all of them unless all are given


def test_two_failure_texts_become_one_with_both_verdict_lines_first() -> None:
    assert gate.combined("GATE\n\ngate body\n\nhint", "BASELINE\n\ntable") == (
        "GATE\nBASELINE\n\ngate body\n\nhint\n\ntable"
    )
    assert gate.combined("GATE", "BASELINE\n\ntable") == "GATE\nBASELINE\n\ntable"


def test_the_gate_counts_only_the_failures_no_helper_of_the_test_raised_on() -> None:
    run = unhealthy("a at '1'", "b at '2'")
    run["hypotheses"][0]["asserted"] = True
    assert [h["summary"] for r in gate.unexpected([run]) for h in r["hypotheses"]] == ["b at '2'"]
    run["hypotheses"][1]["asserted"] = True
    assert gate.unexpected([run]) == []  # every failure was the test's subject: nothing left to gate
    assert (
        gate.unexpected([{"verdict": "healthy", "hypotheses": []}, unhealthy("c at '3'")])[0]["hypotheses"][0][
            "summary"
        ]
        == "c at '3'"
    )
