"""A gradient small by construction at initialisation, that training grows out of, is not vanishing.

Hunt 17 trained 22 Hugging Face model types from tiny configs; two healthy ones were reported as vanishing on every
seed. DeBERTa-v2's relative position table (``rel_embeddings``, read as a tensor by its disentangled attention,
never called as a module) gets its gradient only through the position projections, which start at std 0.02: 3e-8
at step 0. Mamba's ``dt_proj`` feeds a softplus held in its flat region on purpose (its bias is initialised to the
inverse softplus of dt in [0.001, 0.1]). Both gradients grow by orders of magnitude as the model learns, and both
models fit their tasks to 100 %; freezing either layer outright fits as well (plain torch, in the hunt). A layer whose
gradient is small from its first reading and later is not grew out of its starting regime; the gradient did not
vanish on its way back. A gradient that stays small (behind a saturated softmax, tests/runs/test_detect_attention.py;
through a deep sigmoid stack) is still reported.

Ground truth by plain torch: the table's gradient is below 1e-4 at the first step and above it later, and the
classifier learns its task."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neuraldbg import NeuralDbg

transformers = pytest.importorskip("transformers")

STEPS = 120
VOCAB = 32


def task(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded sequences labelled 1 when token 3 occurs in them."""
    g = torch.Generator().manual_seed(1000 + seed)
    n, length = 1200, 16
    ids = torch.randint(4, VOCAB, (n, length), generator=g)
    ids[:, 0] = 1
    lens = torch.randint(7, 13, (n,), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    pos = (torch.rand(n, generator=g) * (lens - 1).float()).long() + 1
    ids[y == 1, pos[y == 1]] = 3
    mask = (torch.arange(length)[None] < lens[:, None]).long()
    return ids * mask, mask, y


def deberta() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.DebertaV2Config(
        vocab_size=VOCAB,
        pad_token_id=0,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
        relative_attention=True,
        position_buckets=8,
        max_relative_positions=16,
        pos_att_type=["p2c", "c2p"],
    )
    return transformers.DebertaV2ForSequenceClassification(config)


def train(model: torch.nn.Module, watched: bool) -> tuple[list[float], list[float], NeuralDbg | None]:
    """The losses, the position table's gradient norm at each step, and the debugger."""
    ids, mask, y = task()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    order = torch.Generator().manual_seed(3000)
    table = model.deberta.encoder.rel_embeddings.weight
    losses, norms = [], []

    def loop() -> None:
        for _ in range(STEPS):
            idx = torch.randint(0, len(ids), (32,), generator=order)
            opt.zero_grad()
            loss = F.cross_entropy(model(input_ids=ids[idx], attention_mask=mask[idx]).logits, y[idx])
            loss.backward()
            norms.append(float(table.grad.norm()))
            opt.step()
            losses.append(loss.item())

    if not watched:
        loop()
        return losses, norms, None
    with NeuralDbg(model) as dbg:
        loop()
    return losses, norms, dbg


def test_deberta_relative_position_table_grows_out_of_its_small_start():
    model = deberta()
    model.train()
    losses, norms, _ = train(model, watched=False)
    # plain torch: tiny at the start, well above 1e-4 later, and the classifier learns its task
    assert norms[0] < 1e-6 and max(norms) > 1e-4
    assert sum(losses[-10:]) / 10 < 0.1 < 0.6 < sum(losses[:10]) / 10
    watched = deberta()
    watched.train()
    again, _, dbg = train(watched, watched=True)
    assert again == losses  # the debugger changes nothing
    assert dbg is not None and dbg.hypotheses() == [], dbg.explain_failure()
