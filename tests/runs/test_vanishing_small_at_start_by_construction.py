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


def marked(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences whose class is a marker token (3 or 4) at a random position after the first."""
    ids = torch.randint(5, 40, (n, 16), generator=g)
    labels = torch.randint(0, 2, (n,), generator=g)
    ids[torch.arange(n), torch.randint(1, 16, (n,), generator=g)] = 3 + labels
    ids[:, 0] = 2
    return ids, labels


def tiny_bert() -> torch.nn.Module:
    config = transformers.BertConfig(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
    )
    return transformers.BertForSequenceClassification(config)


def fit_marked(model: torch.nn.Module, schedule: bool) -> tuple[NeuralDbg, float, list[tuple[float, float, float]]]:
    """200 AdamW steps on the marker task (a cosine schedule when ``schedule``): the debugger, the held-out accuracy,
    and at each step the first attention key's output rms and its gradient norm beside the classifier's."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.01)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 200) if schedule else None
    g = torch.Generator().manual_seed(3)
    ids, labels = marked(g, 3000)
    key = model.bert.encoder.layer[0].attention.self.key
    rms: list[float] = []
    key.register_forward_hook(lambda m, i, o: rms.append(float(o.detach().pow(2).mean().sqrt())))
    readings: list[tuple[float, float, float]] = []
    with NeuralDbg(model) as dbg:
        model.train()
        for _ in range(200):
            i = torch.randint(0, 3000, (32,), generator=g)
            out = model(input_ids=ids[i], labels=labels[i])
            opt.zero_grad()
            out.loss.backward()
            readings.append((rms[-1], norm(key), norm(model.classifier)))
            opt.step()
            if cosine is not None:
                cosine.step()
    model.eval()
    held, held_labels = marked(torch.Generator().manual_seed(4), 500)
    with torch.no_grad():
        accuracy = float((model(input_ids=held).logits.argmax(1) == held_labels).float().mean())
    return dbg, accuracy, readings


def test_a_bert_whose_keys_grow_past_unit_scale_while_it_fits_is_silent():
    """Under a cosine schedule the first attention's keys grow to an rms of about 1.3 while the fit goes on and
    their gradient is still small: logits spread by ~1.7, a softmax far from saturation. A quiet output bounded
    at rms 1 took it for vanishing gradients."""
    torch.manual_seed(0)
    dbg, accuracy, readings = fit_marked(tiny_bert(), schedule=True)
    cfg = dbg.config
    grown = [
        rms
        for rms, key, head in readings
        if rms > 1.0 and key < cfg.vanishing_norm and key < cfg.vanishing_ratio * head
    ]
    assert accuracy > 0.95 and grown and max(grown) < cfg.quiet_output_rms  # plain torch
    assert dbg.hypotheses() == [], dbg.report()
