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
