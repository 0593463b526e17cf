"""Labels shifted twice: a Hugging Face causal LM (which shifts its labels itself) given ``input_ids[:, :-1]`` and
``labels=input_ids[:, 1:]``. Ground truth is plain torch in each test: the model's own loss is the cross-entropy
of logits[t] against the token at t + 1 (it shifts), and the double-shifted model's held-out next-token loss is far
above the twin's. Silent twins: the same model with ``labels=input_ids``, and a language model of the user's own
that does not shift (for which pre-shifted labels are right); and the debugger leaves the training bit-identical."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")

import hf_support
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

KIND = "labels_shifted_twice"
STEPS = 60
VOCAB, SEQ = hf_support.VOCAB, hf_support.SEQ


def tokens(step: int, batch: int = 16) -> torch.Tensor:
    """A learnable corpus: each token is a fixed permutation of the one before, 10 % of the time a random one."""
    perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(90_000 + step)
    ids = torch.empty(batch, SEQ, dtype=torch.long)
    ids[:, 0] = torch.randint(0, VOCAB, (batch,), generator=g)
    for t in range(1, SEQ):
        jump = torch.rand(batch, generator=g) < 0.1
        ids[:, t] = torch.where(jump, torch.randint(0, VOCAB, (batch,), generator=g), perm[ids[:, t - 1]])
    return ids


def call(ids: torch.Tensor, shifted: bool) -> dict[str, torch.Tensor]:
    """The model's arguments: ``labels=input_ids``, or labels shifted by hand as well."""
    if shifted:
        return {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
    return {"input_ids": ids, "labels": ids}


def train(model: nn.Module, shifted: bool, watched: bool) -> NeuralDbg | None:
    """A user's loop (no NeuralDBG call inside): AdamW 1e-3, the model's own loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()

    def loop() -> None:
        for step in range(STEPS):
            opt.zero_grad()
            model(**call(tokens(step), shifted))["loss"].backward()
            opt.step()

    return support.watching(model, loop, watched)


@torch.no_grad()
def next_token_loss(model: nn.Module) -> float:
    """Held-out cross-entropy of logits[t] against the token at t + 1, computed here."""
    model.eval()
    ids = torch.cat([tokens(10_000 + i) for i in range(4)])
    logits = model(input_ids=ids)["logits"]
    return float(F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1)))


class OwnLM(nn.Module):
    """A language model of the user's own: it scores logits[t] against labels[t] (no shift inside), so its loop
    must pass labels already shifted."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.rnn = nn.GRU(32, 64, batch_first=True)
        self.head = nn.Linear(64, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        logits = self.head(self.rnn(self.embed(input_ids))[0])
        out: dict[str, Any] = {"logits": logits}
        if labels is not None:
            out = {"loss": F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1)), **out}
        return out


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_a_causal_lm_given_labels_shifted_by_hand_is_found_and_its_twin_is_silent():
    model = hf_support.gpt2_lm()
    ids = tokens(0)
    with torch.no_grad():  # plain torch: the model shifts the labels itself
        own = model(input_ids=ids, labels=ids)
        by_hand = F.cross_entropy(own.logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    assert torch.allclose(own.loss, by_hand, atol=1e-5)

    train(model, shifted=True, watched=False)
    twin = hf_support.gpt2_lm()
    train(twin, shifted=False, watched=False)
    assert next_token_loss(model) > next_token_loss(twin) + 0.5  # plain torch: trained for the wrong token

    dbg = train(hf_support.gpt2_lm(), shifted=True, watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND
    assert hits[0].root.metrics["ahead"] == 1.0
    assert "labels=input_ids" in hits[0].suggestion

    healthy = train(hf_support.gpt2_lm(), shifted=False, watched=True)
    assert healthy is not None and not found(healthy), healthy.explain_failure()
    assert healthy._recorder.coverage.labels_ahead is not None  # the labels were read, and are not shifted


def test_a_model_that_does_not_shift_its_labels_is_not_judged():
    torch.manual_seed(0)
    model = OwnLM()
    train(model, shifted=True, watched=False)
    torch.manual_seed(0)
    unshifted = OwnLM()
    train(unshifted, shifted=False, watched=False)
    # plain torch: for this model the labels shifted by hand are the right ones (next-token loss far lower)
    assert next_token_loss(model) < next_token_loss(unshifted) - 0.5

    torch.manual_seed(0)
    dbg = train(OwnLM(), shifted=True, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()


def test_checking_the_labels_leaves_the_training_bit_identical():
    plain = hf_support.gpt2_lm()
    train(plain, shifted=True, watched=False)
    watched = hf_support.gpt2_lm()
    dbg = train(watched, shifted=True, watched=True)
    assert dbg is not None and dbg._recorder.coverage.labels_ahead == 1.0  # the check ran
    for a, b in zip(plain.parameters(), watched.parameters()):
        assert torch.equal(a, b)


def test_the_label_checks_are_spent_once_over_a_run_attached_step_by_step(monkeypatch):
    from neuraldbg.capture.forward import LABEL_CHECKS
    from neuraldbg.stats import tensors

    calls: list[int] = []
    real = tensors.labels_ahead

    def counted(ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return real(ids, labels)

    monkeypatch.setattr(tensors, "labels_ahead", counted)
    model = hf_support.gpt2_lm()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dbg = NeuralDbg(model)
    for step in range(3 * LABEL_CHECKS):  # every step fully observed (the first 16 are), each its own attachment
        with dbg:
            opt.zero_grad()
            model(**call(tokens(step), shifted=True))["loss"].backward()
            opt.step()
    assert dbg.steps == 3 * LABEL_CHECKS
    assert len(calls) == LABEL_CHECKS  # a continued run goes on with the checks it has left
    assert dbg._recorder.coverage.labels_ahead == 1.0
