"""A CLIP-style model (two encoders, cosine similarities scaled by a learned temperature starting at 1/0.07, the
symmetric in-batch cross-entropy) trained on image-caption pairs whose captions were shuffled apart from their
images: its loss stays at log(batch), chance, while the twin on true pairs learns. The untrained model's loss
starts far above chance (the temperature scales random similarities up), which must not hide it. Ground truth by
plain torch: held-out retrieval accuracy."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

BATCH = 64


def pairs(shuffled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and captions made from one hidden code each; shuffled: the captions of other images."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 32, generator=g), torch.randn(8, 24, generator=g)
    z = torch.randn(5000, 8, generator=g)
    images = torch.tanh(z @ a) + 0.3 * torch.randn(5000, 32, generator=g)
    captions = torch.relu(z @ b) + 0.3 * torch.randn(5000, 24, generator=g)
    if shuffled:
        captions = captions[torch.randperm(5000, generator=g)]
    return images, captions


class Clip(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
        self.text = nn.Sequential(nn.Linear(24, 128), nn.GELU(), nn.Linear(128, 32))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, images: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
        a, b = F.normalize(self.image(images), dim=-1), F.normalize(self.text(captions), dim=-1)
        return self.logit_scale.exp().clamp(max=100) * a @ b.t()


def train(shuffled: bool) -> tuple[NeuralDbg, list[float], float]:
    """(debugger, losses, held-out retrieval accuracy on the true pairs, 1 in 64)."""
    images, captions = pairs(shuffled)
    torch.manual_seed(0)
    model = Clip()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    losses = []
    with NeuralDbg(model) as dbg:
        for _ in range(300):
            i = torch.randperm(4000, generator=g)[:BATCH]
            logits = model(images[i], captions[i])
            y = torch.arange(BATCH)
            loss = (F.cross_entropy(logits, y) + F.cross_entropy(logits.t(), y)) / 2
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    true_images, true_captions = pairs(False)
    with torch.no_grad():
        logits = model(true_images[4000:4064], true_captions[4000:4064])
    return dbg, losses, float((logits.argmax(1) == torch.arange(BATCH)).float().mean())


@pytest.mark.parametrize("shuffled", [True, False])
def test_a_contrastive_model_given_shuffled_pairs_stays_at_chance(shuffled):
    dbg, losses, retrieval = train(shuffled)
    chance = math.log(BATCH)
    assert losses[0] > chance / 0.75  # plain torch: the untrained loss starts far above chance
    if shuffled:
        # plain torch: the loss ends at chance and nothing is retrieved beyond a guess
        assert abs(sum(losses[-50:]) / 50 - chance) < 0.05 * chance and retrieval < 0.1
        assert FailureKind.LOSS_AT_CHANCE in {h.kind for h in dbg.hypotheses()}, dbg.report()
    else:
        assert sum(losses[-50:]) / 50 < 0.7 * chance and retrieval > 0.3  # the twin on true pairs learns
        assert dbg.healthy, dbg.explain_failure()
