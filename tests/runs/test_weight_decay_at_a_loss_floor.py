"""A usual coupled weight decay at a loss that sits on a floor above zero is not decay far too strong.

Under Adagrad or SGD with momentum, weight_decay=0.01 adds 0.01 x W to the gradient. Once the loss reaches its floor
(a grammar's entropy, the KL to label-smoothed targets), the loss's own gradient is small, so that term makes up
most of each step and trims the extra norm of the initialisation, at no cost: the same program without decay reaches
the same held-out accuracy and the same loss (plain torch, checked in each test). When the run began, the decay was
the smaller part of the steps. A decay a hundred times larger holds the loss above that floor and is still found.
"""

from __future__ import annotations

import functools
import math
import statistics

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.kinds import excessive_weight_decay

KIND = "excessive_weight_decay"
#: The grammar: the next token follows a fixed table with probability FOLLOW, else any token.
VOCAB, LENGTH, FOLLOW = 12, 24, 0.85


def found(dbg: NeuralDbg | None) -> bool:
    assert dbg is not None
    return any(h.kind.value == KIND for h in dbg.hypotheses())


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


# ------------------------------------------------------------------------------------ an Adagrad LM on a grammar


def grammar_entropy() -> float:
    """The next token's entropy in nats: the floor of the LM's loss."""
    hit = FOLLOW + (1 - FOLLOW) / VOCAB
    miss = (1 - FOLLOW) / VOCAB
    return -hit * math.log(hit) - (VOCAB - 1) * miss * math.log(miss)


def sentences(n: int, g: torch.Generator, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.zeros(n, LENGTH + 1, dtype=torch.long)
    x[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for i in range(1, LENGTH + 1):
        follow = torch.rand(n, generator=g) < FOLLOW
        x[:, i] = torch.where(follow, table[x[:, i - 1]], torch.randint(0, VOCAB, (n,), generator=g))
    return x[:, :-1], x[:, 1:]


class LM(nn.Module):
    """A one-layer causal pre-norm transformer."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, width)
        self.pos = nn.Parameter(torch.randn(1, LENGTH, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, 0.3, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.orthogonal_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.norm(self.enc(self.emb(x) + self.pos, mask=mask, is_causal=True)))


def train_lm(decay: float, watched: bool, sgd: bool = False) -> tuple[list[float], float, NeuralDbg | None]:
    """Adagrad(lr 0.033), or SGD with momentum, under a cosine schedule, 60 steps of 32 sentences: the losses, the
    held-out next-token accuracy and the debugger."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    table = torch.randint(0, VOCAB, (VOCAB,), generator=g)
    (x, y), (x_held, y_held) = sentences(2000, g, table), sentences(500, g, table)
    model = LM()
    if sgd:
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=decay)
    else:
        opt = torch.optim.Adagrad(model.parameters(), lr=0.033, weight_decay=decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=60)
    losses: list[float] = []

    def loop() -> None:
        for _ in range(60):
            idx = torch.randint(0, len(x), (32,), generator=g)
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]).reshape(-1, VOCAB), y[idx].reshape(-1))
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))

    dbg = support.watching(model, loop, watched)
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x_held).argmax(-1) == y_held).float().mean())
    return losses, accuracy, dbg


@functools.cache
def without_decay(sgd: bool) -> tuple[float, float]:
    """The same program without decay: the mean of its last 15 losses and its held-out accuracy."""
    losses, accuracy, _ = train_lm(0.0, watched=False, sgd=sgd)
    return mean(losses[-15:]), accuracy


# ------------------------------------------------------------------------------------------------------------ tests

#: The LM under Adagrad (as in the fuzzed program) and under SGD with momentum.
OPTIMIZERS = pytest.mark.parametrize("sgd", [False, True], ids=["adagrad", "sgd_momentum"])


@OPTIMIZERS
def test_a_usual_coupled_decay_at_the_grammars_entropy_is_silent(sgd: bool):
    floor = grammar_entropy()
    bare, bare_accuracy = without_decay(sgd)
    plain, accuracy, _ = train_lm(0.01, watched=False, sgd=sgd)
    # plain torch: the decay costs nothing; with or without it the loss ends at the grammar's entropy
    assert abs(accuracy - bare_accuracy) < 0.01
    assert abs(mean(plain[-15:]) - floor) < 0.05 and abs(bare - floor) < 0.05
    losses, _, dbg = train_lm(0.01, watched=True, sgd=sgd)
    assert losses == plain  # the debugger changed nothing
    assert dbg is not None
    # the situation: the decay makes up most of each late step, yet was the smaller part when the run began
    found_shares = [s for _, s, _, _ in excessive_weight_decay.shares(dbg._recorder.coverage)]
    half, tenth = len(found_shares) // 2, len(found_shares) // 10
    assert statistics.median(found_shares[half:]) >= excessive_weight_decay.SHARE
    assert statistics.median(found_shares[:tenth]) < excessive_weight_decay.START_SHARE
    assert not found(dbg), dbg.explain_failure()


@OPTIMIZERS
def test_a_decay_of_one_that_holds_the_loss_above_the_grammars_entropy_is_found(sgd: bool):
    floor = grammar_entropy()
    _, bare_accuracy = without_decay(sgd)
    losses, accuracy, dbg = train_lm(1.0, watched=True, sgd=sgd)
    # plain torch (the debugger changes nothing): the loss is held far above the floor, the accuracy below
    assert mean(losses[-15:]) > floor + 0.4
    assert accuracy < bare_accuracy - 0.02
    assert found(dbg), dbg.explain_failure()
