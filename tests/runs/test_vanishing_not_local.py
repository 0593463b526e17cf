"""A small gradient that did not vanish on its way back is no vanishing gradient (``kinds/vanishing_gradients.py``).

* *Local to a branch.* An attention query whose keys are small gets a tiny gradient (the gradient of the logits
  w.r.t. the query is scaled by the keys), while the layers before it (further from the loss) and the value
  projection beside it get healthy ones. Hugging Face BART and Wav2Vec2 grow their queries to an output rms of
  0.3-0.7 under Adam while their keys stay at 0.2 and the query gradient at 1e-5, and train to 100 %; Whisper's
  cross-attention pre-norm, which feeds only the query, has the same tiny gradient with an output rms of 1 (a
  LayerNorm's output is its gain). Neither is saturated: no sigmoid, tanh or softmax is saturated by inputs of rms
  below 1, and it is the output the norm feeds (the query) that tells the regime, not the norm's own.
* *Skipped on some steps.* A residual branch dropped for the whole batch (stochastic depth, LayerDrop) has an exactly
  zero gradient on the steps that skip it and a healthy one on the others; sparse sampling can land only on
  skipped steps (the hunt's residual MLP: every 16th step was a dropped one), which read as "exactly zero, still so".

Ground truth by plain torch inside each test (per-step gradient norms read from ``.grad``, output rms, the fit).
The twins truly vanish and are still reported: a saturated softmax (query and key at std 30), a branch skipped on
every step, a branch that trains and is then skipped for the rest of the run.
"""

from __future__ import annotations

from collections.abc import Callable

import support
import torch
import torch.nn as nn
import torch.nn.functional as F

from neuraldbg import FailureKind, NeuralDbg

VOCAB, SOURCE, DIM, HEADS = 16, 12, 64, 2
CONFIG = NeuralDbg(nn.Linear(1, 1)).config  # the defaults the rule reads


class Block(nn.Module):
    """A pre-norm residual MLP block whose branch can be skipped for the whole batch: stochastic depth in
    torchvision's mode='batch', LayerDrop (the branch runs and is multiplied by 0)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.skip = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.f(x) * (0.0 if self.skip else 1.0)


def residual_mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), Block(32), Block(32), nn.LayerNorm(32), nn.Linear(32, 1))


def schedule(skipped: Callable[[int], bool]) -> Callable[[int, nn.Sequential], None]:
    """Sets whether block 2's branch is skipped, before each step."""

    def on_step(step: int, model: nn.Sequential) -> None:
        model[2].skip = skipped(step)

    return on_step


STEPS = 100


def dropped(step: int) -> bool:
    """A drop schedule that alternates over the first 16 steps (all observed) and then skips the branch on the first
    9 of every 16 steps: the sampling (every 16th step, and a window of 8 after a new finding) lands on skipped
    steps only, as the hunt's random drops did by chance. The branch trains on 7 of every 16 steps."""
    return step % 2 == 1 if step < 16 else step % 16 < 9


def plain_branch(on_step: Callable[[int, nn.Sequential], None]) -> tuple[list[float], float, list[float]]:
    """Plain torch: block 2's last Linear's gradient norm per step, how far its weight moved, the losses."""
    model, batches = residual_mlp(), support.regression_batches()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    layer = model[2].f[3]
    start, grads, losses = layer.weight.detach().clone(), [], []
    for step in range(STEPS):
        on_step(step, model)
        x, y = batches(step)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        grads.append(float(layer.weight.grad.norm()))
        opt.step()
        losses.append(loss.item())
    return grads, float((layer.weight.detach() - start).norm() / start.norm()), losses


def debug_branch(on_step: Callable[[int, nn.Sequential], None]) -> NeuralDbg:
    model = residual_mlp()
    dbg, _ = support.train(
        model,
        support.regression_batches(),
        F.mse_loss,
        steps=STEPS,
        optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
        on_step=lambda step, _: on_step(step, model),
    )
    return dbg


def test_a_branch_skipped_on_some_steps_and_trained_on_the_others_is_not_vanishing():
    on_step = schedule(dropped)
    grads, moved, losses = plain_branch(on_step)
    # plain torch: exactly zero on the skipped steps (every 16th step among them), healthy on the others; the
    # branch's weights train and the loss falls
    assert all((grads[i] == 0.0) == dropped(i) for i in range(STEPS))
    assert min(g for g in grads if g > 0) > 1e-3
    assert moved > 0.05
    assert sum(losses[-10:]) < 0.2 * sum(losses[:10])

    dbg = debug_branch(on_step)

    assert dbg.hypotheses() == [], dbg.report()


def test_a_branch_skipped_on_every_step_is_still_vanishing():
    on_step = schedule(lambda step: True)
    grads, _, _ = plain_branch(on_step)
    assert all(g == 0.0 for g in grads)  # plain torch: no gradient ever reaches the branch

    vanishing = [h for h in debug_branch(on_step).hypotheses() if h.kind is FailureKind.VANISHING_GRADIENTS]

    assert vanishing and vanishing[0].root.layer.startswith("2.f"), vanishing


def test_a_branch_that_trained_and_is_then_cut_off_for_good_is_still_vanishing():
    on_step = schedule(lambda step: step >= 30)
    grads, _, _ = plain_branch(on_step)
    assert all(g > 1e-3 for g in grads[:30]) and all(g == 0.0 for g in grads[30:])  # plain torch

    vanishing = [h for h in debug_branch(on_step).hypotheses() if h.kind is FailureKind.VANISHING_GRADIENTS]

    assert vanishing and vanishing[0].root.layer.startswith("2.f"), vanishing
