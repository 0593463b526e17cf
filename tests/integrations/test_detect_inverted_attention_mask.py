"""An inverted ``attention_mask`` given to a Hugging Face model: ``1 - attention_mask`` (0 on the real tokens, 1 on
the padding) to a BERT classifier pooled at its class token. Ground truth is plain torch in each test: the class
token's output does not change when every real token does, and held-out accuracy is worse than the twin's with the
mask as the tokenizer returns it. Silent twins: that one, and the same model given no attention mask."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import hf_support
import support
import torch
from torch import nn

KIND = "inverted_padding_mask"
VOCAB, SEQ, PAD, CLS = 40, 16, 0, 1
STEPS = 120


def batch(step: int, n: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A class token and 3-11 random tokens padded with ``PAD``, the attention mask of that padding, and the label:
    whether most of the real tokens are small ids."""
    g = torch.Generator().manual_seed(60_000 + step)
    ids = torch.randint(3, VOCAB, (n, SEQ), generator=g)
    lengths = torch.randint(4, 12, (n, 1), generator=g)
    mask = (torch.arange(SEQ) < lengths).long()
    ids = ids * mask
    ids[:, 0] = CLS
    small = ((ids >= 3) & (ids < 21)).sum(1)
    return ids, mask, (2 * small > lengths.squeeze(1) - 1).long()


def train(mask: str):
    """A user's loop over a tiny BERT classifier, AdamW 5e-4; ``mask``: "inverted", "right", "zeros" or "none"."""
    model = hf_support.bert_classifier(vocab=VOCAB, positions=SEQ)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
    model.train()

    def loop() -> None:
        for step in range(STEPS):
            ids, attention, y = batch(step % 60)
            given = {
                "none": {},
                "right": {"attention_mask": attention},
                "inverted": {"attention_mask": 1 - attention},
                "zeros": {"attention_mask": torch.zeros_like(attention)},
            }
            opt.zero_grad()
            model(input_ids=ids, labels=y, **given[mask]).loss.backward()
            opt.step()

    return model, support.watching(model, loop, True)


@torch.no_grad()
def accuracy(model: nn.Module, inverted: bool) -> float:
    model.eval()
    ids, attention, y = batch(90_000, n=512)
    logits = model(input_ids=ids, attention_mask=1 - attention if inverted else attention).logits
    return float((logits.argmax(1) == y).float().mean())


@torch.no_grad()
def class_token_reads_the_text(inverted: bool) -> bool:
    """Plain torch, on a fresh model: does the class token's output change when every real token does?"""
    model = hf_support.bert_classifier(vocab=VOCAB, positions=SEQ).eval()
    ids, attention, _ = batch(0)
    other = torch.where(ids >= 3, (ids - 3 + 11) % (VOCAB - 3) + 3, ids)
    given = 1 - attention if inverted else attention

    def cls(tokens: torch.Tensor) -> torch.Tensor:
        return model.bert(input_ids=tokens, attention_mask=given).last_hidden_state[:, 0]

    return not torch.allclose(cls(ids), cls(other), atol=1e-6)


def found(dbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_an_inverted_attention_mask_is_found_and_the_tokenizers_mask_is_silent():
    assert not class_token_reads_the_text(inverted=True)  # plain torch: the class token sees the padding alone
    assert class_token_reads_the_text(inverted=False)
    wrong, dbg = train("inverted")
    right, twin = train("right")
    assert accuracy(wrong, True) < accuracy(right, False) - 0.1, (accuracy(wrong, True), accuracy(right, False))
    hyps = found(dbg)
    assert hyps and hyps[0] is dbg.hypotheses()[0], dbg.explain_failure()
    text = dbg.explain_failure()[0]
    assert "attention_mask given to the model" in text and "input_ids != pad_token_id" in text, text
    assert not found(twin), twin.explain_failure()


def test_no_attention_mask_is_silent():
    _, dbg = train("none")
    assert not found(dbg), dbg.explain_failure()


def test_a_mask_of_zeros_is_found_as_hiding_every_position():
    wrong, dbg = train("zeros")
    right, _ = train("right")
    ids, attention, y = batch(90_000, n=512)
    with torch.no_grad():
        wrong.eval()
        zeros = float(
            (wrong(input_ids=ids, attention_mask=torch.zeros_like(attention)).logits.argmax(1) == y).float().mean()
        )
    assert zeros < accuracy(right, False) - 0.1, (zeros, accuracy(right, False))  # plain torch: the mask hurts
    hyps = found(dbg)
    assert hyps and hyps[0] is dbg.hypotheses()[0], dbg.explain_failure()
    assert "attention_mask given to the model is 0 everywhere" in hyps[0].explanation
