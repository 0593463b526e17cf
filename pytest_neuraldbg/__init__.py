"""pytest-neuraldbg: the ``neuraldbg`` fixture, assertion helpers and CI reports for training health.

::

    from pytest_neuraldbg import assert_healthy

    def test_training_is_healthy(neuraldbg):
        ndbg = neuraldbg.smoke_train(model, loader, loss_fn, steps=30)
        assert_healthy(ndbg)

Importing this package does not import torch, nor any of the engine but its vocabulary: each name below is loaded
from its module on first use, and the engine when a debugger is first created.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

#: Each public name and the module of this package that defines it: loaded on first use, so that pytest, which
#: imports this package at startup through the plugin's entry point, loads none of the engine for a test session
#: that never asks for it.
_EXPORTS: dict[str, str] = {
    "Explanations": "verdict",
    "Hypotheses": "verdict",
    "NeuralDbgBaselineWarning": "baseline.check",
    "NeuralDbgFixture": "fixture",
    "assert_finite": "assertions",
    "assert_healthy": "assertions",
    "assert_learns": "assertions",
    "assert_no_dead_neurons": "assertions",
    "assert_no_exploding_gradients": "assertions",
    "assert_no_saturation": "assertions",
    "assert_no_vanishing_gradients": "assertions",
    "assert_parameters_update": "assertions",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)  # a module of the package, as when all were imported
    else:
        raise AttributeError(f"module 'pytest_neuraldbg' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # the same names, for type checkers and IDEs
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
    from .baseline.check import NeuralDbgBaselineWarning
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
