"""Tiny BERT and GPT-2 built from ``transformers`` configs, trained from scratch with a plain PyTorch loop.

BERT: ``BertForSequenceClassification`` (2 layers, hidden 64) on a synthetic task: which of four marker tokens
occurs most often in a 20-token sequence; the model computes the loss from ``labels``; AdamW 1e-3 with linear
warm-up and decay (``get_linear_schedule_with_warmup``) as in the fine-tuning tutorials. GPT-2:
``GPT2LMHeadModel`` (2 layers, n_embd 64) on text from a fixed Markov chain, ``labels=input_ids`` (the model
shifts them), AdamW 1e-3.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from .. import data
from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything
from ._common import loader

MARKERS = (4, 5, 6, 7)


def marker_sequences(n: int, length: int = 20, vocab: int = 32, seed: int = data.DATA_SEED):
    """Token sequences ([CLS]=1 first) with fillers and markers; the label is the most frequent marker."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(8, vocab, (n, length), generator=g)
    labels = torch.randint(0, 4, (n,), generator=g)
    for i in range(n):
        counts = torch.randint(0, 3, (4,), generator=g)
        counts[labels[i]] = 3 + int(torch.randint(0, 2, (1,), generator=g))
        positions = torch.randperm(length - 1, generator=g)[: int(counts.sum())] + 1
        ids[i, positions] = torch.tensor(MARKERS).repeat_interleave(counts)
    ids[:, 0] = 1
    return ids, labels


def bert_model(seed: int):  # type: ignore[no-untyped-def]
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=32,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=32,
        num_labels=4,
    )
    torch.manual_seed(seed)
    return BertForSequenceClassification(config)


def bert_train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    from transformers import get_linear_schedule_with_warmup

    seed_everything(hp.seed)
    ids, labels = marker_sequences(2560)
    if hp.labels == "shuffled":
        labels = torch.cat(
            [labels[:2048][torch.randperm(2048, generator=torch.Generator().manual_seed(7))], labels[2048:]]
        )
    model = bert_model(hp.seed)
    batches = loader(ids[:2048], labels[:2048], 32)
    total_steps = hp.epochs * len(batches)
    optimizer = torch.optim.AdamW(model.parameters(), lr=hp.lr, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, total_steps // 10, total_steps)
    with session.watch(model):
        model.train()
        for _epoch in range(hp.epochs):
            for input_ids, y in batches:
                if hp.zero_grad:
                    optimizer.zero_grad()
                outputs = model(input_ids=input_ids, labels=y)
                outputs.loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                session.record(outputs.loss)
    model.eval()
    with torch.no_grad():
        pred = model(input_ids=ids[2048:]).logits.argmax(-1)
    return {"metric": float((pred == labels[2048:]).float().mean())}


BERT = Program(
    family="hf_text",
    name="tiny_bert",
    train=bert_train,
    defaults=dict(lr=1e-3, epochs=5, zero_grad=True, labels="true"),
    metric="held-out accuracy",
    higher_is_better=True,
    floor=0.03,
    chance=0.25,
    variants=(
        healthy("BertForSequenceClassification 2x64 from a config, AdamW 1e-3, warm-up + linear decay, clip 1.0"),
        Variant("no_zero_grad", "zero_grad", "optimizer.zero_grad() missing", {"zero_grad": False}, K.NO_ZERO_GRAD),
        Variant(
            "labels_shuffled",
            "labels",
            "training labels permuted apart from the sequences",
            {"labels": "shuffled"},
            K.WRONG_LABELS,
        ),
    ),
)


def gpt2_train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    from transformers import GPT2Config, GPT2LMHeadModel

    seed_everything(hp.seed)
    vocab, length = 64, 32
    train_ids = data.markov_tokens(2048 * 8, vocab)[: 512 * length].view(512, length)
    test_ids = data.markov_tokens(128 * length, vocab, stream=1).view(128, length)
    config = GPT2Config(
        vocab_size=vocab, n_positions=length, n_embd=64, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=hp.lr)
    batches = loader(train_ids, train_ids, 16)
    with session.watch(model):
        model.train()
        for _epoch in range(hp.epochs):
            for input_ids, _ in batches:
                labels = input_ids[:, 1:] if hp.labels == "pre_shifted" else input_ids
                inputs = input_ids[:, :-1] if hp.labels == "pre_shifted" else input_ids
                outputs = model(input_ids=inputs, labels=labels)
                optimizer.zero_grad()
                outputs.loss.backward()
                optimizer.step()
                session.record(outputs.loss)
    model.eval()
    with torch.no_grad():
        return {"metric": float(model(input_ids=test_ids, labels=test_ids).loss)}


GPT2 = Program(
    family="hf_text",
    name="tiny_gpt2",
    train=gpt2_train,
    defaults=dict(lr=1e-3, epochs=4, labels="same"),
    metric="held-out loss (nats/token)",
    higher_is_better=False,
    floor=0.03,
    relative_floor=True,
    chance=math.log(64),
    variants=(
        healthy("GPT2LMHeadModel 2x64 from a config, labels=input_ids, AdamW 1e-3"),
        Variant(
            "labels_shifted_twice",
            "labels",
            "labels shifted by hand as well as inside the model (predicts two tokens ahead)",
            {"labels": "pre_shifted"},
            K.SHIFTED_TWICE,
        ),
        Variant("lr_100x", "learning_rate", "AdamW lr 0.1", {"lr": 0.1}, K.LR_FAR_TOO_HIGH),
    ),
)

PROGRAMS = (BERT, GPT2)
