"""Verdict lines, failure texts and the readable reprs of a watched run's answers."""

from __future__ import annotations

import support
import torch

from neuraldbg import FailureKind
from pytest_neuraldbg import verdict
from pytest_neuraldbg.fixture import NeuralDbgFixture
from pytest_neuraldbg.options import Settings


def hyp(summary: str, kind: str = "dead_neurons", chain: list | None = None) -> dict:
    return {"kind": kind, "summary": summary, "explanation": f"Because {summary}.", "chain": chain or []}


def test_the_headline_is_one_line_under_300_characters() -> None:
    assert verdict.headline([]) == "NeuralDBG: training looks healthy"
    assert verdict.headline([hyp("a at 'x'")]) == "NeuralDBG: training is unhealthy - a at 'x'"
    many = [hyp(f"kind{i} at '{'layer' * 30}{i}'") for i in range(5)]
    line = verdict.headline(many)
    assert line.startswith("NeuralDBG: training is unhealthy - 5 failure hypotheses: kind0")
    assert "\n" not in line and len(line) <= verdict.MAX_HEADLINE and line.endswith("…")


def test_the_failure_text_numbers_hypotheses_only_when_there_are_several() -> None:
    one = verdict.failure_text("HEAD", [hyp("a")])
    assert one == "HEAD\n\nBecause a.\nCausal chain (root first):"
    two = verdict.failure_text("HEAD", [hyp("a"), hyp("b")], ["footer"])
    assert two.split("\n\n") == [
        "HEAD",
        "1. a\nBecause a.\nCausal chain (root first):",
        "2. b\nBecause b.\nCausal chain (root first):",
        "footer",
    ]


def test_a_check_names_the_root_cause_when_its_kind_is_only_an_effect() -> None:
    chain = [
        {"kind": "dead_neurons", "where": "'3'", "step_start": 0},
        {"kind": "vanishing_gradients", "where": "'0'", "step_start": 2},
        {"kind": "vanishing_gradients", "where": "'0'", "step_start": 1},
    ]
    found = [hyp("dead_neurons at '3' from step 0", chain=chain)]
    assert verdict.involves(found[0], ["vanishing_gradients"]) and not verdict.involves(found[0], ["non_finite"])
    assert verdict.kind_headline(found, ["vanishing_gradients"], "vanishing gradients") == (
        "NeuralDBG: vanishing gradients in '0' from step 1, caused by dead_neurons at '3' from step 0"
    )


def test_explanations_read_as_a_verdict_but_stay_a_list() -> None:
    empty = verdict.Explanations()
    assert repr(empty) == "[]" and empty == [] and not empty
    found = verdict.Explanations(["Because a."], ["a at 'x'"])
    assert repr(found) == "<unhealthy training: a at 'x'>"
    assert found == ["Because a."] and isinstance(found, list)
    two = verdict.Explanations(["A.", "B."], ["a", "b"])
    assert repr(two) == "<unhealthy training, 2 failure hypotheses: a; b>"


def test_comparing_with_an_empty_list_lists_every_explanation() -> None:
    found = verdict.Explanations(["Because a.", "Because b."], ["a", "b"])
    assert verdict.compare_lines("==", found, []) == [
        "<unhealthy training, 2 failure hypotheses: a; b> == []",
        "NeuralDBG found a training failure:",
        "  1. Because a.",
        "  2. Because b.",
    ]
    assert verdict.compare_lines("==", [], found) is not None
    assert verdict.compare_lines("!=", found, []) is None
    assert verdict.compare_lines("==", verdict.Explanations(), []) is None


def test_a_watched_debugger_answers_with_readable_lists_and_a_verdict_repr() -> None:
    torch.manual_seed(0)
    model = support.mlp(width=16, depth=2)
    with torch.no_grad():
        model[2].bias.fill_(-20.0)
    ndbg = NeuralDbgFixture(Settings()).smoke_train(model, support.regression_batches(), torch.nn.functional.mse_loss)
    assert repr(ndbg.hypotheses()).startswith("<unhealthy training: dead_neurons at '3' from step 0 (confidence")
    assert ndbg.explain_failure() == [h.explanation for h in ndbg.hypotheses()]
    assert repr(ndbg).endswith(", UNHEALTHY: dead_neurons at '3' from step 0 (confidence 1.00)>")


def test_the_checks_are_the_engines_failure_kinds_run_level_ones_included() -> None:
    from neuraldbg.kinds import BUILTIN

    builtin = [room.name for room in BUILTIN]
    assert verdict.kinds()[: len(builtin)] == sorted(builtin, key=lambda k: list(FailureKind).index(FailureKind(k)))
    run_level = {"no_training_observed", "no_gradient", "eval_mode_training", "degenerate_loss"}
    run_level |= {"incomplete_observation", "loss_scale_collapse", "gradients_not_zeroed", "discarded_gradients"}
    run_level |= {"optimizer_reset", "missing_causal_mask", "module_requires_grad", "view_across_batch"}
    run_level |= {"loss_not_decreasing", "unstable_loss", "loss_at_chance", "unnormalised_inputs"}
    run_level |= {"activation_before_loss", "class_index_regression", "collapsed_output"}
    run_level |= {"labels_shifted_twice", "missing_log_softmax", "missing_sigmoid", "detached_layers"}
    run_level |= {"unreachable_targets", "labels_on_padding", "inverted_padding_mask"}
    run_level |= {"activation_before_loss", "oversized_logits", "unmasked_padding"}
    run_level |= {"excessive_weight_decay", "excessive_dropout", "symmetric_units", "broadcast_loss"}
    run_level |= {"no_nonlinearity", "unshuffled_data", "advantage_not_detached", "attention_across_batch"}
    assert {k for k in builtin if verdict.run_level(k)} == run_level  # written out: a kind moved is noticed
    assert verdict.title("non_finite") == "non-finite values"
    assert verdict.title("no_training_observed") == "no training observed"
    assert verdict.title("eval_mode_training") == "training in eval mode"
    assert verdict.kinds(also=["melted_gradients"])[-1] == "melted_gradients"  # a kind a run reported
