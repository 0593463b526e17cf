"""A loss on its way down that passes through chance is not stuck at chance.

A Hugging Face T5 model built from a small config learns to reverse the first 8 of 24 tokens drawn from 195 (its
vocabulary is 200, so chance is log(200)). Ground truth by plain torch in the test: trained for 600 steps it ends
far below chance (it was learning, not stuck); the debugger watches the same run up to the last step at which the
loss, falling from above chance, is in the 5 % band around it with its second half still falling (read from the
plain run: step 250 on one CPU, 300 on another, where rounding moves the curve). A model stuck at chance (labels
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


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
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
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> list[float]:
    g = torch.Generator().manual_seed(1)
    losses: list[float] = []
    for _ in range(steps):
        ids, mask, labels = batch(g)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_a_t5_model_whose_loss_falls_through_chance_is_not_called_stuck_there():
    chance = math.log(VOCAB)
    plain = train(*model_and_optimizer(), 2 * STEPS)
    assert mean(plain[-50:]) < 0.92 * chance  # plain torch, trained on: the model was learning
    # the run the debugger watches ends where the loss, still falling, is in the 5 % band around chance: its
    # length is read from the plain run (the band is reached at step 250 on one CPU, 300 on another)
    ends = [
        steps
        for steps in range(200, 2 * STEPS + 1, 50)
        if plain[0] > chance
        and abs(mean(plain[steps - 50 : steps]) - chance) < 0.05 * chance
        and mean(plain[steps - 50 : steps]) < mean(plain[steps - 150 : steps - 100]) - 0.05  # second half falling
    ]
    assert ends, [round(mean(plain[s - 50 : s]), 3) for s in range(50, 2 * STEPS + 1, 50)]
    model, opt = model_and_optimizer()
    with NeuralDbg(model) as dbg:
        watched = train(model, opt, ends[-1])
    assert watched == plain[: ends[-1]]  # the same run
    assert dbg.hypotheses() == []
