"""Word-level LSTM language model, shaped like pytorch/examples' word_language_model.

Embedding, 2-layer LSTM, dropout, a decoder; the corpus is batchified into columns and cut into BPTT windows;
the hidden state is detached between windows; training is the example's own update, without an optimizer:
``model.zero_grad()``, ``clip_grad_norm_(0.25)`` and ``p.data.add_(p.grad, alpha=-lr)`` with lr 20.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn

from .. import data
from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything

VOCAB = 64


class RNNModel(nn.Module):
    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float = 0.2) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, x: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        emb = self.drop(self.encoder(x))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        return self.decoder(output).view(-1, self.decoder.out_features), hidden

    def init_hidden(self, bsz: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(tokens: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = tokens.size(0) // bsz
    return tokens[: nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].view(-1)


def repackage_hidden(h: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(v.detach() for v in h)


def train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    train_data = batchify(data.markov_tokens(12000, VOCAB), 16)
    val_data = batchify(data.markov_tokens(4000, VOCAB, stream=1), 10)
    model = RNNModel(VOCAB, 32, 64, 2)
    criterion = nn.CrossEntropyLoss()
    bptt, lr = 20, hp.lr
    with session.watch(model):
        for _epoch in range(hp.epochs):
            model.train()
            hidden = model.init_hidden(16)
            for i in range(0, train_data.size(0) - 1, bptt):
                x, targets = get_batch(train_data, i, bptt)
                hidden = repackage_hidden(hidden)
                if hp.zero_grad:
                    model.zero_grad()
                output, hidden = model(x, hidden)
                loss = criterion(output, targets)
                loss.backward()
                if hp.clip is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), hp.clip)
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-lr)
                session.record(loss)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        hidden = model.init_hidden(10)
        for i in range(0, val_data.size(0) - 1, bptt):
            x, targets = get_batch(val_data, i, bptt)
            output, hidden = model(x, hidden)
            total += len(targets) * float(criterion(output, targets))
            count += len(targets)
    return {"metric": total / count}


PROGRAM = Program(
    family="language_model",
    name="word_lm",
    train=train,
    defaults=dict(lr=20.0, clip=0.25, epochs=4, zero_grad=True),
    metric="validation loss (nats/token)",
    higher_is_better=False,
    floor=0.03,
    relative_floor=True,
    chance=math.log(VOCAB),
    variants=(
        healthy("Embedding-LSTM(2)-Linear, manual SGD lr 20 with clip_grad_norm_ 0.25, BPTT 20"),
        Variant("lr_200", "learning_rate", "lr 200 (clipping still on)", {"lr": 200.0}, K.LR_TOO_HIGH),
        Variant("lr_0.02", "learning_rate", "lr 0.02", {"lr": 0.02}, K.LR_TOO_LOW),
        Variant(
            "no_clipping",
            "gradient_clipping",
            "clip_grad_norm_ removed (lr 20)",
            {"clip": None},
            K.LR_TOO_HIGH | {"exploding_gradients"},
        ),
        Variant("clip_1e-4", "gradient_clipping", "clip_grad_norm_ to 1e-4", {"clip": 1e-4}, K.TINY_CLIPPING),
        Variant("no_zero_grad", "zero_grad", "model.zero_grad() missing", {"zero_grad": False}, K.NO_ZERO_GRAD),
    ),
)

PROGRAMS = (PROGRAM,)
