"""Labels shifted twice, on data that repeats its tokens: a Hugging Face GPT-2 (tiny config) trained on flattened
pixel sprites, mostly background, so the next token is the current one at most positions. Called as documented
(``labels=input_ids``), most labels are also the next input token; only where the next token differs from the
current one do unshifted and shifted labels part. Ground truth is plain torch: the model's own loss is the
cross-entropy of logits[t] against the token at t + 1 with ``labels=input_ids`` (silent), and against the token at
t + 2 with labels shifted by hand (``input_ids[:, 1:]``, -100 at the end: found)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import support
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from neuraldbg import NeuralDbg

KIND = "labels_shifted_twice"
SIDE, BOS, VOCAB = 8, 4, 5
STEPS = 12


def sprites(step: int, batch: int = 16) -> torch.Tensor:
    """BOS, then an 8x8 image flattened: background 0 with one rectangle of colour 1-3."""
    g = torch.Generator().manual_seed(step)
    img = torch.zeros(batch, SIDE, SIDE, dtype=torch.long)
    for i in range(batch):
        r, c = torch.randint(1, SIDE - 3, (2,), generator=g).tolist()
        h, w = torch.randint(1, 3, (2,), generator=g).tolist()
        img[i, r : r + h, c : c + w] = int(torch.randint(1, 4, (), generator=g))
    return torch.cat([torch.full((batch, 1), BOS), img.flatten(1)], 1)


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=1,
        n_head=2,
        n_positions=SIDE * SIDE + 1,
        bos_token_id=BOS,
        eos_token_id=BOS,
    )
    return GPT2LMHeadModel(config)


def labels_for(ids: torch.Tensor, shifted: bool) -> torch.Tensor:
    """``input_ids`` itself, or shifted by hand as well (the last position not scored)."""
    if not shifted:
        return ids
    return torch.cat([ids[:, 1:], torch.full((ids.size(0), 1), -100)], 1)


def train(model: nn.Module, shifted: bool, watched: bool) -> NeuralDbg | None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loop() -> None:
        for step in range(STEPS):
            ids = sprites(step)
            opt.zero_grad()
            model(input_ids=ids, labels=labels_for(ids, shifted)).loss.backward()
            opt.step()

    return support.watching(model, loop, watched)


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


@torch.no_grad()
def scored_ahead(model: nn.Module, shifted: bool) -> int:
    """Plain torch: how many places ahead of each position the model's own loss scores it (1 or 2)."""
    ids = sprites(999)
    out = model(input_ids=ids, labels=labels_for(ids, shifted))
    flat = out.logits.reshape(-1, VOCAB)
    for ahead in (1, 2):
        target = torch.cat([ids[:, ahead:], torch.full((ids.size(0), ahead), -100)], 1)
        if torch.allclose(out.loss, F.cross_entropy(flat, target.reshape(-1)), atol=1e-5):
            return ahead
    return 0


def test_unshifted_labels_on_repeating_tokens_are_silent_and_labels_shifted_by_hand_are_found():
    ids = sprites(0)
    assert float((ids[:, 1:] == ids[:, :-1]).float().mean()) > 0.9  # plain torch: the data repeats its tokens
    model = gpt2()
    assert scored_ahead(model, shifted=False) == 1  # labels=input_ids: the model scores the next token
    assert scored_ahead(model, shifted=True) == 2  # shifted by hand as well: the token two places ahead

    healthy = train(gpt2(), shifted=False, watched=True)
    assert healthy is not None and not found(healthy), healthy.explain_failure()
    assert healthy._recorder.coverage.labels_ahead == 0.0  # read, and no label is the next token where it differs

    twin = train(gpt2(), shifted=True, watched=True)
    assert twin is not None
    hits = found(twin)
    assert hits, twin.explain_failure()
    assert hits[0].root.metrics["ahead"] == 1.0
    assert "labels=input_ids" in hits[0].suggestion
