"""Attention over padding needs keys that are the token positions. An image captioner's padded captions (the loss
ignores PAD) go through a GRU and attend, with no mask, over 16 image patches (which also self-attend with no mask):
no key is a padding position, and a (batch, tokens) padding mask would not even fit the keys. Ground truth is plain
torch: appending padding columns changes the logits at the real caption positions by exactly 0 (silent). Its twin
also lets the caption states attend to each other without a mask: there the real positions' logits move with the
padding, and that layer alone is found."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

KIND = "unmasked_padding"
PAD, BOS, EOS, VOCAB = 0, 1, 2, 12
STEPS = 8


def batch(step: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Images of a coloured square (colour and size are the caption's words) and captions of 4 or 7 tokens,
    padded with PAD at the end."""
    g = torch.Generator().manual_seed(step)
    images = 0.05 * torch.randn(size, 3, 16, 16, generator=g)
    captions = []
    for i in range(size):
        colour, big = int(torch.randint(0, 3, (), generator=g)), int(torch.randint(0, 2, (), generator=g))
        side = 6 if big else 3
        images[i, colour, 4 : 4 + side, 4 : 4 + side] += 1.0
        tail = [8, 9, 10] if float(torch.rand((), generator=g)) < 0.5 else []
        captions.append(torch.tensor([BOS, 3 + colour, 6 + big, *tail, EOS]))
    return images, nn.utils.rnn.pad_sequence(captions, batch_first=True, padding_value=PAD)


class Captioner(nn.Module):
    def __init__(self, token_attention: bool = False, d: int = 32) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, 4)  # 16 patches of 4x4
        self.encoder = nn.TransformerEncoderLayer(d, 4, 2 * d, 0.0, batch_first=True)
        self.embed = nn.Embedding(VOCAB, d, padding_idx=PAD)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.tokens = nn.MultiheadAttention(d, 1, batch_first=True) if token_attention else None
        self.att = nn.MultiheadAttention(d, 1, batch_first=True)
        self.out = nn.Linear(2 * d, VOCAB)

    def forward(self, captions: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        patches = self.encoder(self.patch(images).flatten(2).transpose(1, 2))  # (batch, 16 patches, d)
        y, _ = self.rnn(self.embed(captions), patches.mean(1).unsqueeze(0).contiguous())
        if self.tokens is not None:  # the caption states attend to each other, the padding included
            y = y + self.tokens(y, y, y, need_weights=False)[0]
        context, _ = self.att(y, patches, patches, need_weights=False)  # keys and values: the patches
        return self.out(torch.cat([y, context], -1))


def train(model: nn.Module, watched: bool) -> NeuralDbg | None:
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)

    def loop() -> None:
        for step in range(STEPS):
            images, captions = batch(step)
            logits = model(captions[:, :-1], images)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), captions[:, 1:].reshape(-1), ignore_index=PAD)
            opt.zero_grad()
            loss.backward()
            opt.step()

    return support.watching(model, loop, watched)


@torch.no_grad()
def padding_dependence(model: nn.Module) -> float:
    """Plain torch: how much the logits at the real caption positions move when 5 more padding columns follow."""
    images, captions = batch(999, size=32)
    inputs = captions[:, :-1]
    longer = F.pad(inputs, (0, 5), value=PAD)
    a = model(inputs, images)
    b = model(longer, images)[:, : inputs.size(1)]
    real = captions[:, 1:] != PAD
    return float((a - b).abs().amax(-1)[real].max())


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_attention_over_image_patches_is_silent_and_unmasked_attention_over_the_tokens_is_found():
    torch.manual_seed(0)
    model = Captioner()
    train(model, watched=False)
    assert bool((batch(0)[1] == PAD).any())  # plain torch: the captions are padded
    assert padding_dependence(model) == 0.0  # ... and no real position depends on the padding

    torch.manual_seed(0)
    dbg = train(Captioner(), watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()

    torch.manual_seed(0)
    twin = Captioner(token_attention=True)
    train(twin, watched=False)
    assert padding_dependence(twin) > 1e-3  # plain torch: the real positions now mix in the padding

    torch.manual_seed(0)
    watched = train(Captioner(token_attention=True), watched=True)
    assert watched is not None
    hits = found(watched)
    assert hits, watched.explain_failure()
    assert hits[0].root.detail == "tokens"  # the attention over the patches is no attention over padding
