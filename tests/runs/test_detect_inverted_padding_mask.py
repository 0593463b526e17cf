"""An inverted padding mask in plain torch: an ``nn.TransformerEncoder`` classifier pooled at its class token, given
``src_key_padding_mask = tokens != PAD`` (True on the real tokens, which torch then ignores) instead of
``tokens == PAD``. Ground truth is plain torch in each test: the self-attention's output does not change when every
real token does (it reads the padding alone), and held-out accuracy falls against the twin with the mask right.
Silent twins: the mask right (bool and float) and a mask that hides some real tokens on purpose (token dropout). The
same inverted code on data without padding hides every key, the fault's other form, and is found as such."""

from __future__ import annotations

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg.stats import tensors as stats

KIND = "inverted_padding_mask"
VOCAB, SEQ, PAD, CLS = 30, 12, 0, 1
STEPS = 60


def batch(step: int, n: int = 32, padded: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """A class token, then 2-10 random tokens (3-11 without padding: the whole length), padded with ``PAD``; the
    label says whether most of the real tokens are small ids."""
    g = torch.Generator().manual_seed(50_000 + step)
    ids = torch.randint(2, VOCAB, (n, SEQ), generator=g)
    lengths = torch.randint(3, SEQ, (n, 1), generator=g) if padded else torch.full((n, 1), SEQ)
    ids = torch.where(torch.arange(SEQ) < lengths, ids, PAD)
    ids[:, 0] = CLS
    small = ((ids > CLS) & (ids < 16)).sum(1)
    return ids, (2 * small > lengths.squeeze(1) - 1).long()


class Classifier(nn.Module):
    """A user's encoder classifier; ``mask`` builds its key-padding mask from the tokens."""

    def __init__(self, mask: str = "right", batch_first: bool = True) -> None:
        super().__init__()
        self.mask, self.batch_first = mask, batch_first
        self.emb = nn.Embedding(VOCAB, 32, padding_idx=PAD)
        self.pos = nn.Parameter(torch.randn(SEQ, 32) * 0.1)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=batch_first)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 2)

    def key_mask(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == PAD
        if self.mask == "inverted":
            return ~pad  # the fault: True on the real tokens
        if self.mask == "float":
            return torch.zeros(pad.shape).masked_fill(pad, float("-inf"))
        if self.mask == "dropout" and self.training:  # hide a fifth of the real tokens on purpose, never the class one
            drop = torch.rand(pad.shape) < 0.2
            drop[:, 0] = False
            return pad | drop
        return pad

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids) + self.pos
        mask = self.key_mask(ids)
        if not self.batch_first:  # sequence first: the tokens' batch dimension is second
            return self.head(self.enc(h.transpose(0, 1), src_key_padding_mask=mask)[0])
        return self.head(self.enc(h, src_key_padding_mask=mask)[:, 0])


def train(mask: str, watched: bool = True, padded: bool = True, batch_first: bool = True):
    torch.manual_seed(0)
    model = Classifier(mask, batch_first)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)

    def loop() -> None:
        for step in range(STEPS):
            ids, y = batch(step % 40, padded=padded)
            opt.zero_grad()
            F.cross_entropy(model(ids), y).backward()
            opt.step()

    return model, support.watching(model, loop, watched)


@torch.no_grad()
def accuracy(model: nn.Module) -> float:
    model.eval()
    ids, y = batch(90_000, n=512)
    return float((model(ids).argmax(1) == y).float().mean())


@torch.no_grad()
def attention_reads_the_text(model: Classifier) -> bool:
    """Plain torch: does the first self-attention's output at the class token change when every real token does?"""
    model.eval()
    ids, _ = batch(0)
    other = torch.where(ids > CLS, (ids - 2 + 7) % (VOCAB - 2) + 2, ids)  # every real token replaced, padding kept
    attn = model.enc.layers[0].self_attn

    def first(tokens: torch.Tensor) -> torch.Tensor:
        h = model.emb(tokens) + model.pos
        h = h if model.batch_first else h.transpose(0, 1)
        out, _ = attn(h, h, h, key_padding_mask=model.key_mask(tokens), need_weights=False)
        return out[:, 0] if model.batch_first else out[0]

    return not torch.allclose(first(ids), first(other))


def found(dbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_an_inverted_key_padding_mask_is_found_and_the_right_mask_is_silent():
    wrong, _ = train("inverted", watched=False)
    right, _ = train("right", watched=False)
    # plain torch: the inverted mask leaves the attention blind to the text, and the classifier worse
    assert not attention_reads_the_text(wrong)
    assert attention_reads_the_text(right)
    assert accuracy(wrong) < accuracy(right) - 0.1, (accuracy(wrong), accuracy(right))
    _, dbg = train("inverted")
    hyps = found(dbg)
    assert hyps and hyps[0] is dbg.hypotheses()[0], dbg.explain_failure()
    text = dbg.explain_failure()[0]
    assert "'enc.layers.0.self_attn'" in text and "(tokens == pad_id)" in text, text
    assert hyps[0].root.step_start == 0
    _, twin = train("right")
    assert not found(twin), twin.explain_failure()


@pytest.mark.parametrize("mask", ["float", "dropout"])
def test_masks_that_hide_padding_or_some_tokens_on_purpose_are_silent(mask: str):
    model, dbg = train(mask)
    assert attention_reads_the_text(model)  # plain torch: these masks leave the text visible
    assert not found(dbg), dbg.explain_failure()


def test_the_inverted_code_on_data_without_padding_hides_every_key_and_is_found():
    ids, _ = batch(0, padded=False)
    assert not (ids == PAD).any()  # plain torch: nothing to hide, so the inverted mask hides every key
    model, dbg = train("inverted", padded=False)
    assert not attention_reads_the_text(model)
    hyps = found(dbg)
    assert hyps and hyps[0] is dbg.hypotheses()[0], dbg.explain_failure()
    assert "hiding every position" in hyps[0].explanation and "True everywhere" in hyps[0].explanation


def test_a_sequence_first_encoder_given_the_inverted_mask_is_found():
    model, dbg = train("inverted", batch_first=False)
    assert not attention_reads_the_text(model)  # plain torch: blind to the text here too
    assert found(dbg), dbg.explain_failure()


def test_the_reading_itself():
    ids = torch.tensor([[CLS, 5, 7, PAD, PAD], [CLS, 9, 3, 4, PAD]])
    pad = ids == PAD
    assert float(stats.mask_inverted(ids, stats.hidden_positions(pad, attend_is_one=False))) == 0.0
    assert float(stats.mask_inverted(ids, stats.hidden_positions(~pad, attend_is_one=False))) == 1.0
    scores = torch.zeros(pad.shape).masked_fill(~pad, -1e9)
    assert float(stats.mask_inverted(ids, stats.hidden_positions(scores, attend_is_one=False))) == 1.0
    attend = (~pad).long()
    assert float(stats.mask_inverted(ids, stats.hidden_positions(attend, attend_is_one=True))) == 0.0
    assert float(stats.mask_inverted(ids, stats.hidden_positions(1 - attend, attend_is_one=True))) == 1.0
    # one real token hidden on purpose: the shown positions still differ
    some = pad.clone()
    some[0, 1] = True
    assert float(stats.mask_inverted(ids, some)) == 0.0
    # nothing hidden: no reading; everything hidden: the other form of the fault (2.0)
    assert float(stats.mask_inverted(ids, torch.zeros_like(pad))) == 0.0
    assert float(stats.mask_inverted(ids, torch.ones_like(pad))) == 2.0
    # the text one repeated token, the padding hidden: both sides hold one id each, and nothing says which is text
    same = torch.tensor([[5, 5, 5, PAD], [5, 5, PAD, PAD]])
    assert float(stats.mask_inverted(same, same == PAD)) == 0.0


def test_the_reading_of_a_mask_that_hides_everything():
    ids = torch.tensor([[CLS, 5, 7, PAD], [CLS, 9, 3, 4]])
    assert float(stats.mask_inverted(ids, torch.ones(ids.shape, dtype=torch.bool))) == 2.0
    assert float(stats.mask_inverted(torch.full((2, 4), PAD), torch.ones(2, 4, dtype=torch.bool))) == 0.0
