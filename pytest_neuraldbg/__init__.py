"""pytest-neuraldbg: the ``neuraldbg`` fixture, assertion helpers and CI reports for training health.

::

    from pytest_neuraldbg import assert_healthy

    def test_training_is_healthy(neuraldbg):
        ndbg = neuraldbg.smoke_train(model, loader, loss_fn, steps=30)
        assert_healthy(ndbg)

Importing this package does not import torch; the engine is loaded when a debugger is first created.
"""

from __future__ import annotations

from .assertions import (
    assert_finite,
    assert_healthy,
    assert_learns,
    assert_no_dead_neurons,
    assert_no_exploding_gradients,
    assert_no_saturation,
    assert_no_vanishing_gradients,
    assert_parameters_update,
)
from .baseline import NeuralDbgBaselineWarning
from .fixture import NeuralDbgFixture
from .verdict import Explanations, Hypotheses

__all__ = [
    "Explanations",
    "Hypotheses",
    "NeuralDbgBaselineWarning",
    "NeuralDbgFixture",
    "assert_finite",
    "assert_healthy",
    "assert_learns",
    "assert_no_dead_neurons",
    "assert_no_exploding_gradients",
    "assert_no_saturation",
    "assert_no_vanishing_gradients",
    "assert_parameters_update",
]
