"""Oversized updates: a learning rate so high that every step rewrites a large share of the weights while the
gradients stay modest (a transformer under Adam at lr 1). Ground truth by plain torch: the median over the weight
matrices of ||dW|| / ||W|| per step (parameter copies around ``optimizer.step()``), the largest layer gradient norm,
and the loss against the same model trained at lr 1e-3."""

from __future__ import annotations

import statistics

import support
import torch
import torch.nn.functional as F

from neuraldbg import FailureKind, NeuralDbg

STEPS = 60


def run(lr: float) -> tuple[NeuralDbg, list[float], list[float], float]:
    """Train the tiny transformer; returns the debugger, the losses, the median update/weight ratio per step and
    the largest layer gradient norm seen (plain torch)."""
    torch.manual_seed(0)
    model = support.TinyTransformer()
    batches = support.token_batches()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    weights = [p for p in model.parameters() if p.dim() == 2]
    losses: list[float] = []
    ratios: list[float] = []
    top = 0.0
    with NeuralDbg(model) as dbg:
        for step in range(STEPS):
            x, y = batches(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            top = max(top, max(support.layer_gradients(model).values()))
            before = [w.detach().clone() for w in weights]
            opt.step()
            ratios.append(statistics.median(float((w.detach() - b).norm() / b.norm()) for w, b in zip(weights, before)))
            losses.append(loss.item())
    return dbg, losses, ratios, top


def test_a_learning_rate_far_too_high_is_named_oversized_updates_with_its_numbers() -> None:
    dbg, losses, ratios, top = run(1.0)
    _, healthy, healthy_ratios, _ = run(1e-3)

    # plain torch: a tenth of the weights or more rewritten at each of the first steps (healthy: under 1% at every
    # step; afterwards the weights Adam inflated are so large that the same step is a smaller share), modest
    # gradients, and a fit far worse than the twin's
    surge = [step for step, ratio in enumerate(ratios) if ratio > 0.1]
    assert surge[0] == 0 and len(surge) >= 5
    assert max(healthy_ratios) < 0.01
    assert top < 100
    assert statistics.fmean(losses[-10:]) > 5 * statistics.fmean(healthy[-10:])

    top_hypothesis = dbg.hypotheses()[0]
    assert top_hypothesis.kind is FailureKind.OVERSIZED_UPDATES
    assert top_hypothesis.root.step_start == surge[0]
    assert FailureKind.EXPLODING_GRADIENTS not in {h.kind for h in dbg.hypotheses()}
    words = top_hypothesis.explanation
    assert "learning rate 1" in words and "of their size" in words
    assert "the fit got worse meanwhile" in words and "rose from" in words
    assert "lower the learning rate" in words


def test_the_same_transformer_at_a_sane_learning_rate_is_silent() -> None:
    dbg, losses, _, _ = run(1e-3)
    assert statistics.fmean(losses[-10:]) < 0.6 * losses[0]  # plain torch: it learns
    assert dbg.hypotheses() == []
