"""A crash inside the user's own model is the test's failure: NeuralDBG does not add that the model was never
called."""

from __future__ import annotations

import pytest

TEST = """
from torch import nn
import models


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)

    def forward(self, x):
        raise ValueError("shapes do not match")


def test_crash(neuraldbg):
    neuraldbg.smoke_train(Broken(), models.data(), models.loss, steps=5)
"""


def test_a_crash_in_the_model_is_not_called_a_model_never_called(project: pytest.Pytester) -> None:
    project.makepyfile(test_crash=TEST)
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "ValueError: shapes do not match" in text
    assert "the model was never called" not in text
    assert "NeuralDBG has no verdict on this run: the test raised ValueError after 0 observed training steps" in text
