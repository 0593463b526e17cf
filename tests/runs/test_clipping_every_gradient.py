"""Every gradient clipped to a tiny norm (``TrainingArguments(max_grad_norm=1e-6)``, ``clip_grad_norm_(params,
1e-6)``): each layer's gradient a millionth of what the backward pass left, the ratios between layers as they were.
Vanishing gradients are the backward pass losing the gradient on its way down, so each layer is judged by its norm
before clipping; the attention projections of a BERT at initialisation, small there by construction, read as they
would unclipped. The fault is the clipping: the weights barely move and the fix names its threshold (sweep F of the
eighteenth session: reported as vanishing gradients at an attention key, told to add residual connections).

Ground truth by plain torch: the clip factor, the held-out accuracy against the twin clipped at 1.0, and the same
layer's gradient before clipping against the largest layer's."""

from __future__ import annotations

import pytest
import support
import torch
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

transformers = pytest.importorskip("transformers")

VOCAB, LENGTH = 40, 16


def tokens(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences whose label says whether most of their tokens (after the first) are "small" ids."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (n, LENGTH), generator=g)
    ids[:, 0] = 1
    return ids, (((ids[:, 1:] < 21).sum(1) * 2) > LENGTH - 1).long()


def bert() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=LENGTH,
        num_labels=2,
    )
    return transformers.BertForSequenceClassification(config)


def train(max_norm: float, watched: bool) -> tuple[float, list[float], NeuralDbg | None]:
    """AdamW 5e-4, 150 steps of 32, every gradient clipped to ``max_norm``: held-out accuracy, each step's clip
    factor (the norm before clipping over ``max_norm``), the debugger."""
    model = bert()
    ids, labels = tokens(4096, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
    factors: list[float] = []

    def loop() -> None:
        for step in range(150):
            batch = slice(32 * step % 4096, 32 * step % 4096 + 32)
            opt.zero_grad()
            model(input_ids=ids[batch], labels=labels[batch]).loss.backward()
            total = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
            factors.append(total / max_norm)
            opt.step()

    dbg = support.watching(model, loop, watched)
    held_ids, held_labels = tokens(1024, 1)
    model.eval()
    with torch.no_grad():
        accuracy = float((model(input_ids=held_ids).logits.argmax(-1) == held_labels).float().mean())
    return accuracy, factors, dbg


def test_every_gradient_clipped_to_a_millionth_is_a_stall_named_by_its_clipping_not_vanishing_gradients():
    accuracy, factors, dbg = train(1e-6, watched=True)
    twin_accuracy, _, twin = train(1.0, watched=True)
    _, labels = tokens(1024, 1)
    majority = max(float(labels.float().mean()), 1 - float(labels.float().mean()))
    # plain torch: clipping made every gradient 1e4 times smaller or more; the model stays at the majority class
    # while its twin learns the task
    assert min(factors) > 1e4
    assert accuracy <= majority + 0.02 and twin_accuracy > 0.95, (accuracy, twin_accuracy)

    assert dbg is not None and twin is not None
    kinds = [h.kind for h in dbg.hypotheses()]
    assert FailureKind.VANISHING_GRADIENTS not in kinds, dbg.explain_failure()
    first = dbg.hypotheses()[0]
    assert first.kind is FailureKind.STALLED_UPDATES, dbg.explain_failure()
    assert "clipping" in first.explanation and "clip_grad_norm_" in first.explanation
    assert twin.healthy, twin.explain_failure()
