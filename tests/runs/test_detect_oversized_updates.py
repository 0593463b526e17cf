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
            ratios.append(support.median_update_ratio(weights, before))
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


RAISE_AT, RAISED = 150, 0.5


def run_raised(lr_after: float, watched: bool) -> tuple[NeuralDbg | None, list[float], list[float]]:
    """A ReLU MLP 16-32-1 fitting a noisy linear teacher under Adam at 0.01, whose learning rate becomes
    ``lr_after`` at step RAISE_AT; returns the debugger (when watched), the losses and the median update/weight
    ratio of the weight matrices per step (plain torch)."""
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=1)
    batches = support.regression_batches(scale=4.0, noise=0.9)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    weights = [p for p in model.parameters() if p.dim() == 2]

    def raise_lr(step: int, optimizer: torch.optim.Optimizer) -> None:
        if step == RAISE_AT:
            for group in optimizer.param_groups:
                group["lr"] = lr_after

    return support.train_measuring_updates(
        model, batches, F.mse_loss, RAISE_AT + 60, opt, weights, watched, on_step=raise_lr
    )


def test_a_learning_rate_raised_late_in_a_long_run_is_named_oversized_updates() -> None:
    dbg, losses, ratios = run_raised(RAISED, watched=True)
    _, twin, _ = run_raised(0.01, watched=False)
    assert dbg is not None
    mean = statistics.fmean

    # plain torch: the same run as its twin until the raise; then updates of a large share of the weights and a
    # loss thrown far up, for good (the twin stays where it stood)
    assert losses[:RAISE_AT] == twin[:RAISE_AT]
    assert max(ratios[RAISE_AT - 50 : RAISE_AT]) < 0.1 < min(ratios[RAISE_AT + 3 : RAISE_AT + 10])
    before = mean(losses[RAISE_AT - 10 : RAISE_AT])
    assert mean(losses[RAISE_AT : RAISE_AT + 10]) > 4 * before
    assert mean(losses[RAISE_AT:]) > 10 * mean(twin[RAISE_AT:])
    assert mean(losses[-10:]) > 10 * mean(twin[-10:])
    # ... and yet, over its first steps, below the mean loss of the whole run before it: the fall from the start
    # (121 at step 0) is no reference for where the fit stood when the learning rate changed
    assert mean(losses[RAISE_AT : RAISE_AT + 10]) < mean(losses[:RAISE_AT]) / 3

    hypotheses = dbg.hypotheses()
    assert hypotheses, dbg.report()
    top_hypothesis = hypotheses[0]
    assert top_hypothesis.kind is FailureKind.OVERSIZED_UPDATES
    assert RAISE_AT <= top_hypothesis.root.step_start <= RAISE_AT + 5
    words = top_hypothesis.explanation
    assert f"learning rate {RAISED}" in words and "the fit got worse meanwhile: the loss rose from" in words


def test_a_rise_of_a_loss_that_barely_moves_within_bfloat16_rounding_does_not_confirm_large_updates():
    """word2vec's skip-gram under bfloat16 autocast (Adam 0.01): its first steps move the weights by more than
    their small initial norm, and its first losses, all near 6 log 2 (the output vectors start at zero), went from
    4.146 to 4.160, 0.3 %, within bfloat16's rounding (8 bits of mantissa: 0.4 %); with almost no batch-to-batch
    spread that passed for a fit made worse. Plain torch over three seeds: every word's nearest neighbour is of its
    topic, as in float32."""
    for seed in range(3):
        losses, neighbours, _ = support.skipgram_run(0.01, seed, watched=False, bf16=True)
        assert neighbours == 1.0
        assert statistics.mean(losses[:8]) > 3 * statistics.mean(losses[-75:])
    plain, _, _ = support.skipgram_run(0.01, 0, watched=False, bf16=True)
    losses, _, dbg = support.skipgram_run(0.01, 0, watched=True, bf16=True)
    assert losses == plain and dbg is not None
    assert max(losses[1:4]) > losses[0]  # the rise, by rounding
    assert max(losses[1:4]) < 1.01 * losses[0]
    assert dbg.hypotheses() == [], dbg.explain_failure()
