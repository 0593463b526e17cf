"""Attention: tiny BERT- and GPT-2-like models written out by hand (no ``transformers`` needed), healthy, and an
attention block whose gradients truly vanish.

BERT initialises every weight with std 0.02; at that scale the attention logits are ~0, attention is uniform, and
the query/key projections get gradients ~1e-4 of the classifier's (second order in the small init: see
``neuraldbg/kinds/vanishing_gradients.py``). That is the healthy start of every BERT fine-tune, and it resolves as the
weights grow. The faulty twin gates its attention branch with a sigmoid whose bias starts at -12: the gate
passes 6e-6 of the branch, every parameter of the branch gets ~1e-6 of the gradient it would get, and the gate
cannot open, because its own gradient passes through the same closed sigmoid.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import _common as c
from .base import Batch, Run, Scenario

VOCAB, LENGTH = 48, 16


# ----------------------------------------------------------------------------------------------------- data


def majority_tokens(batch_size: int, seed: int) -> c.BatchFn:
    """Token sequences labelled 1 when more than half of their tokens come from the lower half of the vocabulary
    (a bag-of-words task: a model can solve it before its attention learns where to look)."""

    def batch(step: int) -> Batch:
        g = c.generator(seed * 1_000_003 + step)
        lean = torch.rand(batch_size, 1, generator=g) * 0.6 + 0.2  # each sequence leans one way or the other
        low = torch.rand(batch_size, LENGTH, generator=g) < lean
        tokens = torch.randint(0, VOCAB // 2, (batch_size, LENGTH), generator=g) + (~low) * (VOCAB // 2)
        return tokens, (low.sum(dim=1) > LENGTH // 2).long()

    return batch


def markov_text(batch_size: int, seed: int) -> c.BatchFn:
    """Token sequences from a fixed sparse Markov chain (3 successors per token); targets are the next tokens."""
    successors = torch.randint(0, VOCAB, (VOCAB, 3), generator=c.generator(seed))

    def batch(step: int) -> Batch:
        g = c.generator(seed * 1_000_003 + step)
        seq = torch.empty(batch_size, LENGTH + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, VOCAB, (batch_size,), generator=g)
        for i in range(LENGTH):
            seq[:, i + 1] = successors[seq[:, i], torch.randint(0, 3, (batch_size,), generator=g)]
        return seq[:, :-1], seq[:, 1:]

    return batch


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# --------------------------------------------------------------------------------------------------- models


def bert_init(model: nn.Module) -> None:
    """BERT's initialisation: normal(0, 0.02) weights, zero biases, unit LayerNorms."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate query, key and value projections, as BERT writes it."""

    def __init__(self, dim: int, heads: int, *, causal: bool = False) -> None:
        super().__init__()
        self.heads, self.head_dim, self.causal = heads, dim // heads, causal
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(0.0)  # applied to the attention probabilities, as in BERT

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        if self.causal:
            scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        probs = self.dropout(torch.softmax(scores, dim=-1))
        return (probs @ v).transpose(1, 2).reshape(b, t, d)


class BertLayer(nn.Module):
    """Post-norm encoder layer: attention, output projection, residual, LayerNorm; GELU feed-forward likewise."""

    def __init__(self, dim: int, heads: int, gate_bias: float | None = None) -> None:
        super().__init__()
        self.attention = SelfAttention(dim, heads)
        self.attention_output = nn.Linear(dim, dim)
        self.gate = nn.Linear(dim, 1) if gate_bias is not None else None
        self.norm1 = nn.LayerNorm(dim)
        self.intermediate = nn.Linear(dim, 2 * dim)
        self.output = nn.Linear(2 * dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self._gate_bias = gate_bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch = self.attention_output(self.attention(x))
        if self.gate is not None:  # a gated residual branch (as in GTrXL): sigmoid(gate(x)) scales the attention
            branch = torch.sigmoid(self.gate(x)) * branch
        x = self.norm1(x + branch)
        return self.norm2(x + self.output(F.gelu(self.intermediate(x))))


class TinyBert(nn.Module):
    """Word and position embeddings with a LayerNorm, post-norm layers, a tanh pooler on the first position and
    a classifier: BertForSequenceClassification at 2 layers and hidden size 64."""

    def __init__(self, classes: int = 2, dim: int = 64, depth: int = 2, heads: int = 2, gate_bias: float | None = None):
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, dim)
        self.position_embeddings = nn.Embedding(LENGTH, dim)
        self.embedding_norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(BertLayer(dim, heads, gate_bias if i == 0 else None) for i in range(depth))
        self.pooler = nn.Linear(dim, dim)
        self.pooler_act = nn.Tanh()
        self.classifier = nn.Linear(dim, classes)
        bert_init(self)
        for layer in self.layers:
            if layer.gate is not None and gate_bias is not None:
                nn.init.constant_(layer.gate.bias, gate_bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embedding_norm(self.word_embeddings(tokens) + self.position_embeddings.weight[: tokens.shape[1]])
        for layer in self.layers:
            h = layer(h)
        return self.classifier(self.pooler_act(self.pooler(h[:, 0])))


class GPT2Block(nn.Module):
    """Pre-norm decoder block with GPT-2's fused query/key/value projection and causal attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp_proj = nn.Linear(4 * dim, dim)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in self.c_attn(self.ln_1(x)).split(d, 2)
        )
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class TinyGPT2(nn.Module):
    """GPT2LMHeadModel at 2 layers and width 64: token and position embeddings, pre-norm blocks, a final
    LayerNorm and a language-model head tied to the token embeddings."""

    def __init__(self, dim: int = 64, depth: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, dim)
        self.wpe = nn.Embedding(LENGTH, dim)
        self.h = nn.ModuleList(GPT2Block(dim, heads) for _ in range(depth))
        self.ln_f = nn.LayerNorm(dim)
        bert_init(self)  # GPT-2 uses the same normal(0, 0.02)
        for block in self.h:  # and scales the residual projections by 1/sqrt(2 * depth)
            nn.init.normal_(block.c_proj.weight, std=0.02 / math.sqrt(2 * depth))
            nn.init.normal_(block.mlp_proj.weight, std=0.02 / math.sqrt(2 * depth))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.wte(tokens) + self.wpe.weight[: tokens.shape[1]]
        for block in self.h:
            h = block(h)
        return self.ln_f(h) @ self.wte.weight.T


# --------------------------------------------------------------------------------------------------- builds


def _bert() -> Run:
    torch.manual_seed(300)
    model = TinyBert()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    return Run(model, [opt], nn.CrossEntropyLoss(), majority_tokens(16, seed=3000), steps=50)


def _gpt2() -> Run:
    torch.manual_seed(301)
    model = TinyGPT2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    return Run(model, [opt], lm_loss, markov_text(16, seed=3001), steps=50)


def _gate_closed() -> Run:
    torch.manual_seed(302)
    model = TinyBert(gate_bias=-12.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    return Run(model, [opt], nn.CrossEntropyLoss(), majority_tokens(16, seed=3002), steps=50)


#: The gated attention branch of the faulty twin: every layer whose gradient passes through the closed gate.
GATED_BRANCH = frozenset(
    {
        "layers.0.attention.query",
        "layers.0.attention.key",
        "layers.0.attention.value",
        "layers.0.attention_output",
        "layers.0.gate",
    }
)

SCENARIOS = [
    Scenario(
        name="healthy_tiny_bert_adamw",
        arch="transformer",
        description="A BERT-style classifier written out by hand (2 layers, hidden 64, std-0.02 init, tanh pooler) "
        "fine-tuned with AdamW: its query and key projections start with gradients ~1e-4 of the classifier's.",
        truth=c.truth(
            evidence=f"{c.HEALTHY.evidence}; attention is uniform at step 0 and the query/key gradients are "
            "small only at the start (they grow as the weights do)"
        ),
        build=_bert,
    ),
    Scenario(
        name="healthy_tiny_gpt2_lm",
        arch="transformer",
        description="A GPT-2-style causal language model written out by hand (2 layers, width 64, fused query/key/"
        "value projection, tied head) trained with AdamW on a Markov-chain text.",
        truth=c.HEALTHY,
        build=_gpt2,
    ),
    Scenario(
        name="vanishing_attention_gate_stuck_closed",
        arch="transformer",
        description="The BERT-style classifier with its first attention branch gated by sigmoid(gate(x)), the gate's "
        "bias initialised to -12: the branch and its gate get ~1e-6 of the gradient they need, for good.",
        truth=c.truth(
            ["vanishing_gradients"],
            roots=GATED_BRANCH,
            onset=(0, 2),
            evidence="every layer of the gated branch gets < 1e-4 of the classifier's gradient at every step; the "
            "gate stays below 1e-4 open; with the gate bias at 0 each of those layers starts with >= 1e3x more",
        ),
        build=_gate_closed,
    ),
]
