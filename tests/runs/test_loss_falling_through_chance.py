"""A loss on its way down that passes through chance is not stuck at chance.

A Hugging Face T5 model built from a small config learns to reverse the first 8 of 24 tokens drawn from 195 (its
vocabulary is 200, so chance is log(200)). Ground truth by plain torch in the test: over its first 300 steps the
loss falls from above chance into the 5 % band around it and its second half is still falling; the same model
trained on, without the debugger, ends far below chance: it was learning, not stuck. A model stuck at chance (labels
drawn at random, apart from the inputs) is found: ``tests/runs/test_detect_loss.py``."""

from __future__ import annotations

import math

import pytest
import torch

from neuraldbg import NeuralDbg

transformers = pytest.importorskip("transformers")

VOCAB = 200
STEPS = 300


def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, VOCAB, (16, 24), generator=g)
    ids[:, -1] = 2  # end of sequence
    mask = torch.ones_like(ids)
    mask[:8, 18:] = 0  # half the batch padded at the end
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask, ids[:, :8].flip(1).clone()


def test_a_t5_model_whose_loss_falls_through_chance_is_not_called_stuck_there():
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=64,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        d_kv=16,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    model = transformers.T5ForConditionalGeneration(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    losses: list[float] = []

    def train(steps: int) -> None:
        for _ in range(steps):
            ids, mask, labels = batch(g)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))

    with NeuralDbg(model) as dbg:
        train(STEPS)
    chance = math.log(VOCAB)
    end = sum(losses[STEPS - 50 : STEPS]) / 50
    assert losses[0] > chance and abs(end - chance) < 0.05 * chance  # in the band around chance at the end
    assert end < sum(losses[150:200]) / 50 - 0.05  # ... and its second half still falling
    train(STEPS)  # plain torch, on: the model was learning
    assert sum(losses[-50:]) / 50 < 0.92 * chance
    assert dbg.hypotheses() == []
