"""The rules of ``class_index_regression`` on profiles and curves written by hand (labels broadcast across a
prediction's outputs; integers from 0 on one output), and the graph reading that finds a broadcast target, on
tensors built here."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from neuraldbg.capture import loss_graph
from neuraldbg.capture.coverage import Coverage, RunFacts
from neuraldbg.config import DebugConfig
from neuraldbg.kinds.class_index_regression import MOST_VALUES, ClassIndexRegression


def finding(profile: tuple[float, float, float, float], outputs: int = 10):
    coverage = Coverage()
    coverage.regression_target = profile
    coverage.repeated_target = (outputs, "head", 3)
    coverage.last_step = 99
    return ClassIndexRegression().run_finding(coverage, RunFacts(1, 100, 100, DebugConfig()))


def test_integer_labels_from_zero_broadcast_across_outputs_are_reported_from_where_they_were_seen():
    event = finding((1.0, 0.0, 9.0, 8.25))
    assert event is not None
    assert (event.step_start, event.step_end, event.layer, event.detail) == (3, 99, "", "head")
    assert event.metrics["outputs"] == 10.0


def test_two_labels_across_two_outputs_are_enough():
    assert finding((1.0, 0.0, 1.0, 0.25), outputs=2) is not None
    assert finding((1.0, 0.0, 1.0, 0.25), outputs=3) is None  # three heads' Brier scores on 0/1 labels


@pytest.mark.parametrize(
    "profile",
    [
        (0.0, 0.0, 9.0, 8.25),  # fractional values: quantities
        (1.0, -1.0, 1.0, 0.7),  # negative values: no class index
        (1.0, 0.0, float(MOST_VALUES), 80.0),  # more values than a label set has
        (1.0, 2.0, 2.0, 0.0),  # one value: nothing to tell apart
        (1.0, 0.0, 4.0, 2.0),  # five values for ten outputs: no label per output (a count regressed at each step)
        (1.0, 1.0, 10.0, 8.25),  # labels from 1: they do not index the outputs
    ],
    ids=["fractional", "negative", "too many values", "constant", "fewer values than outputs", "from one"],
)
def test_targets_that_are_no_class_indices_are_not_reported(profile):
    assert finding(profile) is None


def mse_node(prediction: torch.Tensor, target: torch.Tensor) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return F.mse_loss(prediction, target)


def test_the_graph_reading_tells_a_broadcast_target_from_a_copied_one_and_from_one_value_per_sample():
    logits = torch.randn(8, 5, requires_grad=True) * 1.0
    labels = torch.randint(0, 5, (8,)).float()
    broadcast = loss_graph.regression([mse_node(logits, labels.unsqueeze(1))])
    assert broadcast is not None and (broadcast.samples, broadcast.outputs) == (8, 5)
    assert broadcast.target.shape == (8, 1) and torch.equal(broadcast.target[:, 0], labels)
    assert broadcast.node == id(logits.grad_fn)
    # the same labels copied into every column are of the prediction's own shape: not read as broadcast
    assert loss_graph.regression([mse_node(logits, labels.unsqueeze(1).repeat(1, 5))]) is None
    single = loss_graph.regression([mse_node(logits[:, :1], labels.unsqueeze(1))])
    assert single is not None and single.outputs == 1


def test_a_poorly_fitted_scale_from_one_is_no_class_indices_and_one_from_zero_is():
    """One output per sample: integers 1-5 (ratings) fitted poorly are a scale; 0-4 fitted as poorly are judged."""

    def single(low: float, high: float):
        coverage = Coverage()
        coverage.regression_target = (1.0, low, high, 1.6)
        for step in range(200):
            coverage.losses.add(step, 1.7 if step < 20 else 1.05)
            coverage.last_step = step
        coverage.training.steps = 200
        return ClassIndexRegression().run_finding(coverage, RunFacts(1, 200, 200, DebugConfig()))

    assert single(0.0, 4.0) is not None
    assert single(1.0, 5.0) is None
