"""Healthy training programs of families nobody wrote a detector test for (``tests/healthy_families.py``): an
LSTM under LBFGS with a closure, a row-by-row RNN classifier, DQN with a target network, SimCLR's NT-Xent,
knowledge distillation, a U-Net with pos_weight, sparse EmbeddingBag factors under SparseAdam, bfloat16 autocast,
gradient accumulation, a weight-tied language model, a top-1 mixture of experts, hand-written SGD on polynomial
features, a tied denoising autoencoder, gradient checkpointing, weight_norm parametrizations, validation in
eval mode between steps, CTC sequence labelling, a LightningModule with manual optimisation.

Each is first shown healthy with plain torch (the loss falls to under half, every gradient finite, every
parameter moves, no layer's output zero everywhere), then run again, unchanged, under NeuralDbg: the same losses
bit for bit, and no failure event, hypothesis or explanation.
"""

from __future__ import annotations

from typing import Any

import healthy_families as hf
import pytest
from torch import nn

from neuraldbg import NeuralDbg

SLOW = {"lstm_lbfgs", "lightning_manual_optimisation"}  # LBFGS re-runs the LSTM 8 times a step; Trainer start-up


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(hf.PROGRAMS)]
)
def test_a_healthy_program_of_a_new_family_is_healthy_in_plain_torch_and_silent_under_the_debugger(name: str) -> None:
    program = hf.PROGRAMS[name]
    health = hf.PlainHealth()
    plain = program(health.observe)

    assert hf.fell(plain) < 0.5, plain  # it trains
    assert health.grad_count > 0 and health.grads_finite
    assert health.moved and health.still_parameters() == []
    assert health.always_zero and health.dead_layers() == []

    box: dict[str, NeuralDbg] = {}

    def observe(model: nn.Module) -> Any:
        box["dbg"] = NeuralDbg(model)
        return box["dbg"]

    watched = program(observe)
    dbg = box["dbg"]

    assert watched == plain  # the debugger does not change the training it watches
    assert [e for e in dbg.events if e.kind is not None] == [], dbg.report()
    assert dbg.hypotheses() == []
    assert dbg.explain_failure() == []
