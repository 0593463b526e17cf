"""Labels on padding: a Hugging Face causal LM given sequences padded to a common length, their padding labelled
with the pad token's id instead of -100, so its loss scores the padding. Ground truth is plain torch in each test:
the share of the scored labels on padding, and the held-out next-token accuracy on the real tokens against the twin
that labels its padding -100. Silent twins: that one, and the same model given no attention mask (nothing says
where the padding is) or sequences with no padding at all."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import hf_support
import support
import torch
from torch import nn

from neuraldbg import NeuralDbg

KIND = "labels_on_padding"
STEPS = 80
VOCAB, SEQ = hf_support.VOCAB, hf_support.SEQ
PAD = VOCAB - 1


def counting(step: int, batch: int = 16, padded: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Counting sequences (each token the one before plus one) of 3-5 tokens padded with ``PAD`` to ``SEQ``, and
    their attention mask; unpadded, the whole length."""
    g = torch.Generator().manual_seed(70_000 + step)
    ids = (torch.randint(0, PAD, (batch, 1), generator=g) + torch.arange(SEQ)) % PAD
    lengths = torch.randint(3, 6, (batch, 1), generator=g) if padded else torch.full((batch, 1), SEQ)
    mask = (torch.arange(SEQ) < lengths).long()
    return torch.where(mask.bool(), ids, torch.full_like(ids, PAD)), mask


def train(pad_label: bool, watched: bool, padded: bool = True, masked: bool = True) -> tuple[nn.Module, NeuralDbg]:
    """A user's loop over a tiny GPT-2, AdamW 1e-3: ``labels=input_ids`` as padded (``pad_label``) or with -100 on
    the padding; the attention mask given (``masked``) or not."""
    model = hf_support.gpt2_lm()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()

    def loop() -> None:
        for step in range(STEPS):
            ids, mask = counting(step, padded=padded)
            labels = ids if pad_label else ids.masked_fill(mask == 0, -100)
            opt.zero_grad()
            given = {"attention_mask": mask} if masked else {}
            model(input_ids=ids, labels=labels, **given)["loss"].backward()
            opt.step()

    dbg = support.watching(model, loop, watched)
    assert dbg is not None or not watched
    return model, dbg  # type: ignore[return-value]


@torch.no_grad()
def real_token_accuracy(model: nn.Module) -> float:
    """Held-out next-token accuracy at the real tokens (the positions the mask shows, after the first)."""
    model.eval()
    ids, mask = counting(10_000, batch=256)
    logits = model(input_ids=ids, attention_mask=mask)["logits"][:, :-1]
    right = logits.argmax(-1) == ids[:, 1:]
    return float(right[mask[:, 1:] == 1].float().mean())


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_padding_labelled_with_its_token_is_found_and_the_twin_labelling_it_minus_100_is_silent():
    _, mask = counting(0)
    scored = mask[:, 1:].numel()
    # plain torch: labels=input_ids score every position, three in four of them padding
    assert float((mask[:, 1:] == 0).sum()) / scored > 0.5
    model, _ = train(pad_label=True, watched=False)
    twin, _ = train(pad_label=False, watched=False)
    assert real_token_accuracy(model) < real_token_accuracy(twin) - 0.1, (
        real_token_accuracy(model),
        real_token_accuracy(twin),
    )

    _, dbg = train(pad_label=True, watched=True)
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.metrics["padded"] > 0.5 and hits[0].root.step_start == 0
    assert "-100" in hits[0].explanation and "attention_mask" in hits[0].explanation
    _, silent = train(pad_label=False, watched=True)
    assert not found(silent), silent.explain_failure()
    assert silent._recorder.coverage.scored_padding == 0.0  # read, and nothing scored on the padding


@pytest.mark.parametrize(("padded", "masked"), [(False, True), (True, False)], ids=["no padding", "no mask given"])
def test_no_padding_or_no_mask_to_say_where_it_is_is_not_judged(padded: bool, masked: bool):
    _, dbg = train(pad_label=True, watched=True, padded=padded, masked=masked)
    assert not found(dbg), dbg.explain_failure()
