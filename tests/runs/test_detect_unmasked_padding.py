"""Attention over padding: a sequence model whose loss ignores the padding token (``ignore_index=PAD``), fed padded
batches, whose attention runs without any mask. Ground truth is plain torch in each test: the model's outputs at
the real positions change when more padding is appended (they depend on the padding), and do not in the twins
(the key-padding mask passed; a causal model whose padding comes at the end). A tagger without attention, a model
whose batches hold no padding, and a loss with torch's default ``ignore_index`` stay silent; a tagger laid out
sequence first (tokens and keys of shape (length, batch)) is found as the batch-first one is."""

from __future__ import annotations

from collections.abc import Callable

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

KIND = "unmasked_padding"
PAD = 0
VOCAB = 24
SEQ = 12
STEPS = 40


def batch(step: int, padded: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of 4-12 tokens (1..VOCAB-1) padded with PAD at the end; target: each real token's successor mod
    the vocabulary, PAD at the padding (the loss ignores it)."""
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(1, VOCAB, (32, SEQ), generator=g)
    if padded:
        lengths = torch.randint(4, SEQ + 1, (32,), generator=g)
        tokens[torch.arange(SEQ)[None, :] >= lengths[:, None]] = PAD
    targets = torch.where(tokens == PAD, PAD, tokens % (VOCAB - 1) + 1)
    return tokens, targets


class Tagger(nn.Module):
    def __init__(self, mask: str) -> None:
        super().__init__()
        self.mask = mask  # "none", "padding" or "causal"
        self.embed = nn.Embedding(VOCAB, 32)
        self.encoder = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.mask == "padding":
            h = self.encoder(x, src_key_padding_mask=tokens == PAD)
        elif self.mask == "causal":
            causal = nn.Transformer.generate_square_subsequent_mask(tokens.size(1))
            h = self.encoder(x, src_mask=causal, is_causal=True)
        else:
            h = self.encoder(x)
        return self.head(h)


class NoAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, VOCAB))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


def train(model: nn.Module, watched: bool, padded: bool = True, ignore: int = PAD) -> NeuralDbg | None:
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def loop() -> None:
        for step in range(STEPS):
            tokens, targets = batch(step, padded)
            opt.zero_grad()
            out = model(tokens)
            F.cross_entropy(out.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=ignore).backward()
            opt.step()

    return support.watching(model, loop, watched)


def padding_dependence(model: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """Plain torch: how much the outputs at the real positions move when 6 more padding tokens are appended."""
    tokens, _ = batch(999)
    longer = torch.cat([tokens, torch.full((tokens.size(0), 6), PAD)], dim=1)
    with torch.no_grad():  # training mode (no dropout here): the plain attention path, not the fast one
        a = model(tokens)
        b = model(longer)[:, : tokens.size(1)]
    real = tokens != PAD
    return float((a - b).abs().amax(-1)[real].max())


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_attention_without_a_padding_mask_is_found_and_the_masked_twin_is_silent():
    torch.manual_seed(0)
    model = Tagger("none")
    train(model, watched=False)
    torch.manual_seed(0)
    twin = Tagger("padding")
    train(twin, watched=False)
    # plain torch: without the mask the real positions' outputs depend on how much padding follows; with it, not
    assert padding_dependence(model) > 1e-2
    assert padding_dependence(twin) < 1e-5

    torch.manual_seed(0)
    dbg = train(Tagger("none"), watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.detail == "encoder.self_attn"
    assert hits[0].root.metrics["padding_id"] == PAD
    assert "src_key_padding_mask=(src == 0)" in hits[0].explanation
    torch.manual_seed(0)
    masked = train(Tagger("padding"), watched=True)
    assert masked is not None and not found(masked), masked.explain_failure()


def test_a_causal_model_with_padding_at_the_end_is_silent():
    torch.manual_seed(0)
    model = Tagger("causal")
    train(model, watched=False)
    assert padding_dependence(model) < 1e-5  # plain torch: no real token attends to the padding after it
    torch.manual_seed(0)
    dbg = train(Tagger("causal"), watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()


def test_no_attention_no_padding_or_no_padding_token_is_silent():
    torch.manual_seed(0)
    no_attention = train(NoAttention(), watched=True)
    assert no_attention is not None and not found(no_attention), no_attention.explain_failure()
    assert not bool((batch(0, padded=False)[0] == PAD).any())  # plain torch: full-length batches hold no PAD
    torch.manual_seed(0)
    full_length = train(Tagger("none"), watched=True, padded=False)
    assert full_length is not None and not found(full_length), full_length.explain_failure()
    torch.manual_seed(0)
    default_ignore = train(Tagger("none"), watched=True, ignore=-100)  # the loss names no padding token
    assert default_ignore is not None and not found(default_ignore), default_ignore.explain_failure()


def test_the_padding_check_leaves_training_bit_identical():
    torch.manual_seed(0)
    plain = Tagger("none")
    train(plain, watched=False)
    torch.manual_seed(0)
    watched = Tagger("none")
    dbg = train(watched, watched=True)
    assert dbg is not None and found(dbg)
    for (name, a), (_, b) in zip(plain.named_parameters(), watched.named_parameters()):
        assert torch.equal(a, b), name


class SequenceFirstTagger(nn.Module):
    """The Tagger laid out sequence first: tokens (length, batch), attention keys (length, batch, features)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.encoder = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def test_unmasked_attention_over_sequence_first_tokens_is_found():
    torch.manual_seed(0)
    model = SequenceFirstTagger()
    batch_first = lambda tokens: model(tokens.t()).transpose(0, 1)
    assert padding_dependence(batch_first) > 1e-2  # plain torch: the real positions mix in the padding

    torch.manual_seed(0)
    model = SequenceFirstTagger()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def loop() -> None:
        for step in range(STEPS):
            tokens, targets = batch(step)
            opt.zero_grad()
            out = model(tokens.t())  # (length, batch)
            F.cross_entropy(out.reshape(-1, VOCAB), targets.t().reshape(-1), ignore_index=PAD).backward()
            opt.step()

    dbg = support.watching(model, loop, watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.detail == "encoder.self_attn"
