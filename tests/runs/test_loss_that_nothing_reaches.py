"""A loss held at its chance level batch after batch is judged, however small the updates were (the nineteenth
session's sweep: a CLIP built from a config whose 40-token vocabulary lacks the default ``eos_token_id`` pooled
position 0 for every caption; its loss sat at log 16 to a millionth from step 50, zero-shot accuracy 0.055 against
1.00, and it was called healthy with its loss "not judged": its updates added up to 0.09 of the weights' norm).

The program here is that CLIP made small: a text tower that pools the first end-of-text token, or position 0 when
the caption holds none, under the symmetric contrastive loss. Ground truth is plain torch: the text embeddings
identical across the batch, the loss constant over the last steps, the weights moved, zero-shot accuracy at chance
against the twin whose captions hold the token. A slow starter whose loss stays near chance over a short run (its
updates too small to judge it) moves with its batches and stays unjudged; run longer, it learns."""

from __future__ import annotations

import math
import statistics

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.kinds import loss_evidence

VOCAB, LENGTH, BATCH, CONCEPTS = 24, 6, 16, 20
EOS = 49407  # CLIPTextConfig's default eos_token_id: no token of this vocabulary
END = 23  # the captions' last word
STEPS = 160


class DualEncoder(nn.Module):
    """Images and captions embedded side by side; the caption's embedding is its tower's output at the first token
    ``eos`` (``argmax(ids == eos)``: position 0 when the caption holds none, as Hugging Face's CLIP pools)."""

    def __init__(self, eos: int) -> None:
        super().__init__()
        self.eos = eos
        self.image = nn.Linear(8, 32)
        self.token = nn.Embedding(VOCAB, 32)
        self.position = nn.Parameter(0.1 * torch.randn(LENGTH, 32))
        self.text = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        self.scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def captions(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.token(ids) + self.position
        causal = x.cumsum(1) / torch.arange(1, LENGTH + 1)[:, None]  # position t sees tokens 0..t only
        pooled = self.text(causal)[torch.arange(len(ids)), (ids == self.eos).int().argmax(-1)]
        return F.normalize(pooled, dim=-1)

    def forward(self, ids: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        return self.scale.exp() * F.normalize(self.image(images), dim=-1) @ self.captions(ids).T


PROTOTYPES = torch.randn(CONCEPTS, 8, generator=torch.Generator().manual_seed(0))


def caption(concept: int) -> torch.Tensor:
    """Begin-of-text, a group, the concept, the end word, padding."""
    return torch.tensor([1, 2 + concept // 5, 3 + concept, END, 0, 0])


def train(eos: int, watched: bool = True) -> tuple[DualEncoder, list[float], float, NeuralDbg | None]:
    """AdamW at 1e-3 for ``STEPS`` steps of 16 concepts each: the model, its losses, how far its weights moved
    (the norm of the change over the norm at the start) and the debugger."""
    torch.manual_seed(0)
    model = DualEncoder(eos)
    start = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    losses: list[float] = []

    def loop() -> None:
        for _ in range(STEPS):
            concepts = torch.randperm(CONCEPTS, generator=g)[:BATCH]
            images = PROTOTYPES[concepts] + 0.5 * torch.randn(BATCH, 8, generator=g)
            logits = model(torch.stack([caption(int(c)) for c in concepts]), images)
            labels = torch.arange(BATCH)
            loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())

    dbg = support.watching(model, loop, watched)
    end = torch.cat([p.detach().flatten() for p in model.parameters()])
    return model, losses, float((end - start).norm() / start.norm()), dbg


@torch.no_grad()
def zero_shot(model: DualEncoder) -> tuple[float, float]:
    """Held-out accuracy of naming each image's concept among all 20 captions, and the spread of the captions'
    embeddings across them (their largest distance from their mean)."""
    g = torch.Generator().manual_seed(2)
    concepts = torch.randint(0, CONCEPTS, (400,), generator=g)
    images = PROTOTYPES[concepts] + 0.5 * torch.randn(400, 8, generator=g)
    ids = torch.stack([caption(c) for c in range(CONCEPTS)])
    accuracy = float((model(ids, images).argmax(1) == concepts).float().mean())
    text = model.captions(ids)
    return accuracy, float((text - text.mean(0)).norm(dim=1).max())


def test_a_text_tower_pooling_one_position_for_every_caption_holds_its_loss_at_chance_and_is_found():
    model, losses, moved, dbg = train(eos=EOS)
    twin, twin_losses, _, twin_dbg = train(eos=END)
    # plain torch: every caption embeds alike, the loss holds at log 16 batch after batch, the weights moved, and
    # the model names concepts no better than a guess while the twin names them all
    accuracy, spread = zero_shot(model)
    twin_accuracy, twin_spread = zero_shot(twin)
    assert spread < 1e-5 < 0.1 < twin_spread, (spread, twin_spread)
    last = losses[-STEPS // 4 :]
    assert statistics.pstdev(last) < 1e-5 * statistics.mean(last)
    assert abs(statistics.mean(last) - math.log(BATCH)) < 1e-5 * math.log(BATCH)
    assert moved > 0.005  # a hundredth of the weights' norm, net: enough to move a loss they reach
    assert accuracy < 0.15 and twin_accuracy > 0.7, (accuracy, twin_accuracy)  # a guess: 0.05
    assert statistics.mean(twin_losses[-20:]) < 0.2 * math.log(BATCH)
    assert losses == train(eos=EOS, watched=False)[1]  # the debugger changed nothing
    assert dbg is not None and twin_dbg is not None
    # the updates added up to less than loss_trained: before, "its loss was not judged"
    curve = loss_evidence.read(dbg._recorder.coverage, dbg.config)
    assert curve is not None and curve.trained < dbg.config.loss_trained and curve.pinned is not None
    found = dbg.hypotheses()
    assert found and found[0].kind is FailureKind.LOSS_AT_CHANCE, dbg.report()
    explanation = found[0].explanation
    assert "(1) an output that does not depend on the input" in explanation, explanation
    assert "learning rate too low" not in explanation, explanation
    assert "eos_token_id" in found[0].suggestion, found[0].suggestion
    assert twin_dbg.healthy, twin_dbg.report()


def slow_starter(lr: float, steps: int) -> tuple[list[float], NeuralDbg]:
    """An MLP learning which of 4 directions its input points most along, Adam at a small ``lr``: its loss stays
    near log 4 for a long while before it falls."""
    torch.manual_seed(0)
    directions = torch.randn(16, 4)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    losses: list[float] = []
    with NeuralDbg(model) as dbg:
        for _ in range(steps):
            x = torch.randn(64, 16, generator=g)
            loss = F.cross_entropy(model(x), (x @ directions).argmax(1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, dbg


def test_a_slow_starter_near_chance_moves_with_its_batches_and_stays_unjudged():
    short, dbg = slow_starter(5e-5, 200)
    # plain torch: over its last quarter the loss is within the band of log 4 and moves from batch to batch by
    # about a hundredth of it (a loss that depends on its inputs); run four times longer it learns
    last = short[-50:]
    assert abs(statistics.mean(last) - math.log(4)) < 0.05 * math.log(4)
    assert statistics.pstdev(last) > 1e-3 * statistics.mean(last)
    longer, _ = slow_starter(5e-5, 800)
    assert statistics.mean(longer[-50:]) < 0.85 * math.log(4)
    curve = loss_evidence.read(dbg._recorder.coverage, dbg.config)
    assert curve is not None and curve.at_chance and curve.pinned is None
    assert curve.trained >= loss_evidence.PINNED_MOVED * dbg.config.loss_trained  # moved as much as the CLIP's
    assert dbg.hypotheses() == [], dbg.report()
    assert "Its loss was not judged" in dbg.report().splitlines()[0]


def test_a_loss_rounded_to_half_precision_is_not_held_by_its_stillness():
    """A bfloat16 or float16 loss takes few values: one that stays on one of them is no evidence of stillness."""
    assert loss_evidence._coarse(float(torch.tensor(math.log(16), dtype=torch.bfloat16)))
    assert loss_evidence._coarse(float(torch.tensor(math.log(16), dtype=torch.float16)))
    assert not loss_evidence._coarse(float(torch.tensor(math.log(16), dtype=torch.float32)))
    assert not loss_evidence._coarse(1e300)
