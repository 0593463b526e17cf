"""Sequence-to-sequence translation with ``nn.Transformer`` (the shape of PyTorch's translation tutorial).

Token embeddings scaled by sqrt(d_model), sinusoidal positions, ``nn.Transformer``, a generator Linear; the
target mask is ``generate_square_subsequent_mask`` (-inf above the diagonal) and the source, target and memory
key-padding masks mark the PAD tokens; cross-entropy ignores PAD. The 'language' is a reversal through a fixed
word dictionary, padded to the batch.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn

from .. import data
from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything
from ._common import loader

VOCAB = 24


class PositionalEncoding(nn.Module):
    def __init__(self, emb_size: int, dropout: float, maxlen: int = 64) -> None:
        super().__init__()
        den = torch.exp(-torch.arange(0, emb_size, 2) * math.log(10000) / emb_size)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        embedding = torch.zeros((maxlen, emb_size))
        embedding[:, 0::2] = torch.sin(pos * den)
        embedding[:, 1::2] = torch.cos(pos * den)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pos_embedding", embedding.unsqueeze(0))

    def forward(self, token_embedding: torch.Tensor) -> torch.Tensor:
        return self.dropout(token_embedding + self.pos_embedding[:, : token_embedding.size(1)])


class Seq2SeqTransformer(nn.Module):
    def __init__(self, d_model: int = 64, dropout: float = 0.1) -> None:
        super().__init__()
        self.transformer = nn.Transformer(
            d_model=d_model,
            nhead=4,
            num_encoder_layers=1,
            num_decoder_layers=1,
            dim_feedforward=128,
            dropout=dropout,
            batch_first=True,
        )
        self.src_tok_emb = nn.Embedding(VOCAB, d_model)
        self.tgt_tok_emb = nn.Embedding(VOCAB, d_model)
        self.positional_encoding = PositionalEncoding(d_model, dropout)
        self.generator = nn.Linear(d_model, VOCAB)
        self.d_model = d_model

    def forward(self, src, tgt, tgt_mask, src_padding_mask, tgt_padding_mask):  # type: ignore[no-untyped-def]
        src_emb = self.positional_encoding(self.src_tok_emb(src) * math.sqrt(self.d_model))
        tgt_emb = self.positional_encoding(self.tgt_tok_emb(tgt) * math.sqrt(self.d_model))
        outs = self.transformer(
            src_emb,
            tgt_emb,
            tgt_mask=tgt_mask,
            src_key_padding_mask=src_padding_mask,
            tgt_key_padding_mask=tgt_padding_mask,
            memory_key_padding_mask=src_padding_mask,
        )
        return self.generator(outs)


def create_mask(src: torch.Tensor, tgt: torch.Tensor, padding: bool) -> tuple[torch.Tensor, ...]:
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
    if not padding:
        return tgt_mask, None, None  # type: ignore[return-value]
    return tgt_mask, src == data.PAD, tgt == data.PAD


def train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    src, tgt = data.translation_pairs(3072, VOCAB)
    src_train, tgt_train, src_test, tgt_test = src[:2048], tgt[:2048], src[2048:], tgt[2048:]
    model = Seq2SeqTransformer(dropout=hp.dropout)
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    loss_fn = nn.CrossEntropyLoss(ignore_index=data.PAD)
    optimizer = torch.optim.Adam(model.parameters(), lr=hp.lr, betas=(0.9, 0.98), eps=1e-9)
    batches = loader(src_train, tgt_train, hp.batch_size)
    with session.watch(model):
        for _epoch in range(hp.epochs):
            model.train()
            for s, t in batches:
                tgt_input, tgt_out = t[:, :-1], t[:, 1:]
                masks = create_mask(s, tgt_input, hp.padding_mask)
                logits = model(s, tgt_input, *masks)
                optimizer.zero_grad()
                loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1))
                loss.backward()
                optimizer.step()
                session.record(loss)
    model.eval()
    with torch.no_grad():  # teacher-forced token accuracy on held-out pairs, with the masks
        tgt_input, tgt_out = tgt_test[:, :-1], tgt_test[:, 1:]
        logits = model(src_test, tgt_input, *create_mask(src_test, tgt_input, True))
        keep = tgt_out != data.PAD
        accuracy = float((logits.argmax(-1)[keep] == tgt_out[keep]).float().mean())
    return {"metric": accuracy}


PROGRAM = Program(
    family="translation",
    name="transformer_seq2seq",
    train=train,
    defaults=dict(lr=1e-3, batch_size=64, epochs=4, dropout=0.1, padding_mask=True),
    metric="held-out token accuracy",
    higher_is_better=True,
    floor=0.03,
    chance=1 / (VOCAB - 3),
    variants=(
        healthy("nn.Transformer 2+2 layers d64, causal -inf target mask and key-padding masks, Adam 5e-4"),
        Variant("lr_100x", "learning_rate", "Adam lr 0.05", {"lr": 0.05}, K.LR_FAR_TOO_HIGH),
        Variant(
            "no_padding_masks", "masking", "key-padding masks not passed", {"padding_mask": False}, K.UNMASKED_PADDING
        ),
    ),
)

PROGRAMS = (PROGRAM,)
