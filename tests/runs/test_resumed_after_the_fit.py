"""A run watched from a checkpoint onwards, after its fit converged, is judged as the same steps would be within the
whole run. A classifier first seen far below chance had learned before: its fit is measured from chance, and a
layer's small first reading is the converged fit's, not a gradient that vanished (a BERT classifier resumed at loss
0.007, 1/100 of log 2, was reported as vanishing gradients at its attention projections; the whole run is silent).
A model whose gradients do vanish, watched from a checkpoint while still at chance, is still found. Ground truth in
plain torch: the losses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.detectors.base import CHANCE_BELOW, CHANCE_START

transformers = pytest.importorskip("transformers")


def _bert() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=12,
        num_labels=2,
    )
    return transformers.BertForSequenceClassification(config)


def _bert_steps(model: nn.Module, opt: torch.optim.Optimizer, start: int, end: int) -> list[float]:
    ids = torch.randint(0, 64, (1280, 12), generator=torch.Generator().manual_seed(0))
    labels = (ids[:, 0] >= 32).long()  # the first token says the class
    losses = []
    for i in range(start, end):
        j = (i * 16) % 1280
        opt.zero_grad()
        loss = model(input_ids=ids[j : j + 16], labels=labels[j : j + 16]).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_a_classifier_watched_from_a_checkpoint_after_its_fit_converged_is_healthy():
    model = _bert()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = _bert_steps(model, opt, 0, 50)  # not watched: the run up to the checkpoint
    with NeuralDbg(model) as dbg:
        after = _bert_steps(model, opt, 50, 110)
    chance = torch.log(torch.tensor(2.0)).item()
    assert before[0] > 0.9 * chance and after[0] < CHANCE_START[0] * chance / CHANCE_BELOW  # learned before
    assert after[-1] < after[0]  # and still fitting
    assert dbg.explain_failure() == []


def test_the_same_steps_within_the_whole_run_are_healthy_too():
    model = _bert()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with NeuralDbg(model) as dbg:
        _bert_steps(model, opt, 0, 110)
    assert dbg.explain_failure() == []


def test_gradients_that_vanish_in_a_run_watched_from_a_checkpoint_at_chance_are_still_found():
    """A 12-layer sigmoid MLP at PyTorch's default initialisation: its first layers' gradients are orders of
    magnitude below the last one's, and its loss stays at chance; watched from step 30 onwards."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(12):
        layers += [nn.Linear(32, 32), nn.Sigmoid()]
    model = nn.Sequential(*layers, nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1024, 32, generator=g)
    y = (x[:, :4]).argmax(1)

    def steps(start: int, end: int) -> list[float]:
        losses = []
        for i in range(start, end):
            j = (i * 64) % 1024
            opt.zero_grad()
            loss = F.cross_entropy(model(x[j : j + 64]), y[j : j + 64])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    steps(0, 30)
    first = model[0].weight.grad.norm().item() / model[-1].weight.grad.norm().item()
    assert first < 1e-4  # ground truth: the first layer's gradient vanished
    with NeuralDbg(model) as dbg:
        after = steps(30, 110)
    assert after[0] > CHANCE_START[0] * torch.log(torch.tensor(4.0)).item()  # still at chance when watched
    assert FailureKind.VANISHING_GRADIENTS in [h.kind for h in dbg.hypotheses()]


def test_a_run_is_met_mid_training_exactly_when_its_optimizer_held_state_at_the_first_observed_step():
    """The first step's record says whether an optimizer had already stepped; the run's coverage reads it there."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    with NeuralDbg(model) as fresh:
        step()
    assert opt.state  # ground truth: Adam holds its moments from now on
    with NeuralDbg(model) as resumed:
        step()
    assert not fresh._analyzer.coverage.warm_start and resumed._analyzer.coverage.warm_start
