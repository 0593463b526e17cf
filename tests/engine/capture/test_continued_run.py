"""A run continued after ``close()`` (``attach()`` again, a ``with`` block per epoch) goes on where it stopped: the
checks done once per run, on its first backward passes, are not started over at each attachment.

The loss-graph checks (an activation before a loss that applies its own, a regression target's profile, the labels
of an ``nll_loss``...) look at the first :data:`~neuraldbg.capture.ledger.LOSS_CHECKS` backward passes that reach
the model. Until 2026-12-04 every ``attach()`` granted that many again, so a loop attached for a few steps at a time
walked the loss graph on every step and noted every layer's graph node on every forward pass; and the labels counted
by those checks, and each fully observed step's label mix (filed when the next step's labels come), started over
at each attachment: a run attached one step at a time filed no label mix at all. The gradients' marks were dropped
too, so a loop that never zeroed its gradients went unreported when each step had an attachment of its own."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.capture import ledger, loss_graph
from neuraldbg.stats.step import StepData

CLASSES = 10


def _counting_reads(monkeypatch) -> list[int]:
    """Count the loss-graph checks (each reads the graph once) from here on."""
    calls: list[int] = []
    real = loss_graph.read

    def counted(roots):
        calls.append(1)
        return real(roots)

    monkeypatch.setattr(ledger.loss_graph, "read", counted)
    return calls


def _train_in_blocks(model: nn.Module, dbg: NeuralDbg, blocks: int, steps: int) -> None:
    make = support.classification_batches((32,), CLASSES, batch=64)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = 0
    for _ in range(blocks):
        with dbg:  # attached for this block only
            for _ in range(steps):
                x, y = make(step)
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
                step += 1


def _classifier(relu_on_logits: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, CLASSES)]
    if relu_on_logits:
        layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def test_the_loss_checks_are_spent_once_over_the_run_not_once_per_attachment(monkeypatch):
    calls = _counting_reads(monkeypatch)
    torch.manual_seed(0)
    model = _classifier()
    dbg = NeuralDbg(model)
    _train_in_blocks(model, dbg, blocks=4, steps=3)  # 12 backward passes in 4 attachments
    assert dbg.steps == 12
    assert len(calls) == ledger.LOSS_CHECKS  # not 3 in each of the 4 blocks
    # ... and with none left, the forward passes note no layer's graph node
    with dbg:
        assert dbg._recorder.forward.nodes is None


def test_checks_left_at_close_are_taken_after_the_next_attach(monkeypatch):
    calls = _counting_reads(monkeypatch)
    torch.manual_seed(0)
    model = _classifier()
    dbg = NeuralDbg(model)
    _train_in_blocks(model, dbg, blocks=1, steps=ledger.LOSS_CHECKS - 1)
    assert len(calls) == ledger.LOSS_CHECKS - 1
    _train_in_blocks(model, dbg, blocks=1, steps=3)
    assert len(calls) == ledger.LOSS_CHECKS


def test_a_relu_on_the_logits_is_found_when_every_step_has_its_own_attachment():
    torch.manual_seed(0)
    model = _classifier(relu_on_logits=True)
    # ground truth, plain torch: the ReLU cuts about half of the logits, whose gradient is then exactly zero
    assert support.logits_cut_by_relu(model, support.classification_batches((32,), CLASSES, batch=64)(0)) > 0.3

    dbg = NeuralDbg(model)
    _train_in_blocks(model, dbg, blocks=20, steps=1)
    kinds = [h.kind.value for h in dbg.hypotheses()]
    assert "activation_before_loss" in kinds, dbg.explain_failure()


def test_a_healthy_classifier_attached_step_by_step_stays_silent():
    torch.manual_seed(0)
    model = _classifier()
    dbg = NeuralDbg(model)
    _train_in_blocks(model, dbg, blocks=30, steps=1)
    assert not dbg.explain_failure(), dbg.explain_failure()


def _label_readings(blocks: int, steps: int) -> tuple[list[float], list[list[float]]]:
    """The label prior last filed, and every step's label mix, of 8 steps trained in ``blocks`` attachments."""
    torch.manual_seed(0)
    model = _classifier()
    dbg = NeuralDbg(model)
    records: list[StepData] = []
    dbg._recorder._sink = records.extend  # the raw records, not the analysis
    _train_in_blocks(model, dbg, blocks=blocks, steps=steps)
    priors = [r.label_prior for r in records if r.label_prior]
    mixes = sorted(m for r in records for m in r.label_steps)
    return priors[-1], mixes


def test_the_labels_counted_over_a_run_do_not_depend_on_how_often_it_was_attached():
    # ground truth, plain torch: the classes of the first passes' labels are not all one class (a prior to measure)
    make = support.classification_batches((32,), CLASSES, batch=64)
    labels = torch.cat([make(step)[1] for step in range(ledger.LOSS_CHECKS)])
    assert len(labels.unique()) > 1
    whole = _label_readings(blocks=1, steps=8)
    split = _label_readings(blocks=8, steps=1)
    assert whole[0] == split[0]  # the entropy of the same labels, counted over the same 4 passes
    assert len(whole[1]) >= 6 and whole[1] == split[1]  # each fully observed step's mix, filed once


def _train_step_by_step(zero_grad: bool, optimizer: bool, steps: int = 40) -> tuple[NeuralDbg, nn.Module]:
    """A classifier trained with each step in an attachment of its own (``with dbg:`` around one step)."""
    torch.manual_seed(0)
    model = _classifier()
    make = support.classification_batches((32,), CLASSES, batch=64)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    dbg = NeuralDbg(model)
    for step in range(steps):
        with dbg:
            x, y = make(step)
            if zero_grad:
                opt.zero_grad() if optimizer else model.zero_grad()
            F.cross_entropy(model(x), y).backward()
            if optimizer:
                opt.step()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(p.grad, alpha=-1e-2)
    return dbg, model


def test_gradients_never_zeroed_are_found_in_a_run_attached_step_by_step():
    # ground truth, plain torch: without zero_grad the second backward pass adds to the gradient already applied
    torch.manual_seed(0)
    model = _classifier()
    make = support.classification_batches((32,), CLASSES, batch=64)
    x0, y0 = make(0)
    x1, y1 = make(1)
    F.cross_entropy(model(x0), y0).backward()
    first = model[0].weight.grad.clone()
    F.cross_entropy(model(x1), y1).backward()
    alone = torch.autograd.grad(F.cross_entropy(model(x1), y1), model[0].weight)[0]
    torch.testing.assert_close(model[0].weight.grad, first + alone)

    for optimizer in (True, False):
        dbg, _ = _train_step_by_step(zero_grad=False, optimizer=optimizer)
        kinds = [h.kind.value for h in dbg.hypotheses()]
        assert kinds and kinds[0] == "gradients_not_zeroed", (optimizer, dbg.explain_failure())
        healthy, _ = _train_step_by_step(zero_grad=True, optimizer=optimizer)
        assert "gradients_not_zeroed" not in [h.kind.value for h in healthy.hypotheses()], healthy.explain_failure()
