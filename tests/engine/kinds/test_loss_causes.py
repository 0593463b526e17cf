"""The likely causes a loss finding lists are the ones that can apply to the run's loss: a classifier's mistakes
(softmax before CrossEntropyLoss, nll_loss on raw logits) only for a classifier's loss; for a regression's or a
reconstruction's, what keeps such a loss from falling (hunt 21: a VQ-VAE's and a MAML regression's "not decreasing"
listed softmax before CrossEntropyLoss first)."""

from __future__ import annotations

from neuraldbg.kinds import loss_evidence


def fitting(metrics: dict[str, float]) -> loss_evidence.Cause:
    (found,) = [c for c in loss_evidence.causes(metrics, "flat") if c.name == "a loss that does not fit the output"]
    return found


def test_a_regression_loss_is_not_told_about_a_classifiers_mistakes():
    regression = fitting({})
    assert "CrossEntropyLoss" not in regression.evidence + regression.fix
    assert "targets the output cannot reach" in regression.evidence


def test_a_classifier_loss_is_told_about_them():
    classifier = fitting({"classifier": 1.0})
    assert "softmax before CrossEntropyLoss" in classifier.evidence


def test_a_flat_loss_lists_targets_that_do_not_match_the_inputs_first_when_nothing_else_shows():
    """A denoising score model given noise targets shuffled apart from their inputs: its loss stays flat while
    gradients flow and updates are of ordinary size; the targets come before a loss that does not fit the output."""
    names = [c.name for c in loss_evidence.causes({"trained": 5.0, "enough_training": 1.0}, "flat")]
    assert names[:2] == ["targets that do not match the inputs", "a loss that does not fit the output"]
    unstable = [c.name for c in loss_evidence.causes({}, "unstable")]
    assert "targets that do not match the inputs" not in unstable  # a climb is not what shuffled targets do


def test_parameters_no_gradient_reached_are_the_first_cause_when_they_are_most_of_the_model():
    """Six of eight stepped parameters never held a gradient (a reentrant checkpoint on an input without one): that
    comes first, named, and the other causes no longer say the gradients flow."""
    m = {"ungraded": 6.0, "stepped_params": 8.0, "trained": 5.0, "enough_training": 1.0}
    found = loss_evidence.causes(m, "chance", detail="'a.weight', 'a.bias', 'b.weight' and 3 more")
    assert found[0].name == "layers the loss does not reach"
    assert "6 of the 8 parameters the optimizer steps never held a gradient" in found[0].evidence
    assert "'a.weight', 'a.bias', 'b.weight' and 3 more" in found[0].evidence
    assert "use_reentrant=False" in found[0].fix
    # a parameter never used by the forward pass holds no gradient either (a positional embedding never added)
    assert "never used by the forward pass" in found[0].evidence and "use them in forward" in found[0].fix
    assert not any("gradients flow" in c.evidence for c in found)
    assert (
        loss_evidence.moving(m)
        == "the optimizer moves the weights, but 6 of the 8 parameters it steps never held a gradient"
    )


def test_a_few_parameters_no_gradient_reached_rank_after_the_usual_causes_and_never_for_a_climbing_loss():
    """Two of two hundred (a pooler computed and not used beside a head on the first token): mentioned, not first;
    a loss that climbs is not explained by layers that do not train."""
    m = {"ungraded": 2.0, "stepped_params": 200.0, "trained": 5.0, "enough_training": 1.0}
    names = [c.name for c in loss_evidence.causes(m, "chance")]
    assert "layers the loss does not reach" in names and names[0] != "layers the loss does not reach"
    assert "layers the loss does not reach" not in [c.name for c in loss_evidence.causes(m, "unstable")]
    assert loss_evidence.moving({}) == "the gradients flow and the optimizer moves the weights"


def test_a_classifier_whose_loss_graph_shows_raw_logits_is_not_told_about_a_softmax_before_its_loss():
    """The loss graph read a loss that normalises logits itself, given raw logits (``logits_read``): a softmax, a
    ReLU or a sigmoid before it would have been found there (sweep D: a ReLU RNN's unstable cross-entropy listed
    "softmax before CrossEntropyLoss" first). No classifier's loss mistake is listed then, nor a regression's."""
    for finding in ("chance", "flat", "unstable"):
        for metrics in ({"classifier": 1.0, "chance": 2.3, "start": 2.3, "band": 0.05}, {"classifier": 1.0}):
            told = loss_evidence.causes(metrics, finding)
            assert any(c.name == "a loss that does not fit the output" for c in told), (finding, metrics)
            read = loss_evidence.causes({**metrics, "logits_read": 1.0}, finding)
            assert not any(c.name == "a loss that does not fit the output" for c in read), (finding, metrics)
    bce = {"classifier": 1.0, "baseline": loss_evidence.BASELINES["bce"], "band": 0.05}
    assert any(c.name == "a loss that does not fit the output" for c in loss_evidence.causes(bce, "chance"))
    assert not any(
        c.name == "a loss that does not fit the output"
        for c in loss_evidence.causes({**bce, "logits_read": 1.0}, "chance")
    )


def test_a_finding_no_cause_applies_to_still_gets_a_fix():
    """A classifier given its raw logits whose loss climbed under updates of ordinary size (the sweep's DINO teacher
    that received gradients): no listed cause applies, and the fix said where to look instead of nothing."""
    metrics = {"classifier": 1.0, "logits_read": 1.0}
    assert not loss_evidence.causes(metrics, "unstable")
    words, fix = loss_evidence.ranked(metrics, "unstable")
    assert words == "" and fix.startswith("log each term of the loss on its own")
    for finding in ("flat", "chance", "unstable"):
        assert loss_evidence.UNRANKED_FIX[finding]
