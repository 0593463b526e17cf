"""A layer whose gradient is small at its first reading by construction (the query and key projections of attention
at initialisation, the small-signal regime of ``neuraldbg.kinds.vanishing_gradients``) has not "vanished from the
start": when the fit later converges and its gradient shrinks with everyone else's, it is the fit, not a fault.

A Hugging Face DistilBERT classifier built from a small config, trained as users train it (labels handed to the
model, which returns its own loss, so the loss's gradient w.r.t. the model's output is 1 on every step and only the
recorded loss says the fit converged). Ground truth by plain torch in the test: the loss falls from chance to under
1 % of it, a held-out set is classified (over 98 % right), and the key projection's gradient is below ``vanishing_norm``
and ``vanishing_ratio`` of the classifier's (what the rule reads as small) at the first step and on many steps
after the fit converged. The twin whose
gradients do vanish from the start (a deep sigmoid net whose head alone fits) is reported: see
``tests/runs/test_detect_gradients.py``."""

from __future__ import annotations

import math

import pytest
import torch

from neuraldbg import NeuralDbg

transformers = pytest.importorskip("transformers")

VOCAB = 200
STEPS = 150


def batch(g: torch.Generator, n: int = 16, length: int = 24) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, VOCAB, (n, length), generator=g)
    labels = (ids[:, 0] > VOCAB // 2).long()  # the class is read off the first token
    mask = torch.ones(n, length, dtype=torch.long)
    mask[: n // 2, length - 6 :] = 0  # half the batch padded at the end
    return ids.masked_fill(mask == 0, 0), mask, labels


def norm(module: torch.nn.Module) -> float:
    return math.sqrt(sum(float(p.grad.norm()) ** 2 for p in module.parameters() if p.grad is not None))


def test_a_distilbert_classifier_that_converges_is_silent_though_its_key_projection_started_small():
    torch.manual_seed(0)
    config = transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64, num_labels=2
    )
    model = transformers.DistilBertForSequenceClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    losses: list[float] = []
    key = model.distilbert.transformer.layer[0].attention.k_lin
    ratios: list[tuple[float, float]] = []  # (key projection's gradient norm, the classifier's) at each step
    with NeuralDbg(model) as dbg:
        model.train()
        for _ in range(STEPS):
            ids, mask, labels = batch(g)
            out = model(input_ids=ids, attention_mask=mask, labels=labels)
            opt.zero_grad()
            out.loss.backward()
            ratios.append((norm(key), norm(model.classifier)))
            opt.step()
            losses.append(float(out.loss.detach()))
    model.eval()
    with torch.no_grad():
        ids, mask, labels = batch(torch.Generator().manual_seed(99), n=256)
        accuracy = float((model(input_ids=ids, attention_mask=mask).logits.argmax(1) == labels).float().mean())
    # plain torch: a converged, correct fit, whose key projection's gradient is one the rule calls small at its
    # first step (the small-signal regime) and again on many steps once the fit has converged
    cfg = dbg.config
    small = [i for i, (k, h) in enumerate(ratios) if k < cfg.vanishing_norm and k < cfg.vanishing_ratio * h]
    assert 0 in small and len([i for i in small if i >= STEPS // 2]) >= 10
    assert abs(losses[0] - math.log(2)) < 0.05
    assert sum(losses[-30:]) / 30 < 0.01 * math.log(2)
    assert accuracy > 0.98
    assert dbg.hypotheses() == []
