"""The loss of each step, recorded from the backward pass with no call to NeuralDBG in the loop: under a GradScaler
(its scale divided out) and under Lightning with gradient accumulation (the micro-batch losses, divided by the
number of micro-batches as Lightning does, summed into the step's loss). Ground truth: the losses the loop itself
computed, with plain torch; the training is the same weight for weight."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from lightning_support import kit, make_loader, quiet_trainer
from torch import nn

from neuraldbg import NeuralDbg


def recorded(dbg: NeuralDbg) -> list[float]:
    return [v for _, v in dbg._recorder.coverage.losses.first]


def test_the_loss_under_a_grad_scaler_is_recorded_unscaled_and_the_training_is_unchanged():
    def train(watched: bool) -> tuple[nn.Module, list[float], NeuralDbg | None]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        g = torch.Generator().manual_seed(1)
        losses: list[float] = []
        dbg = NeuralDbg(model) if watched else None
        if dbg is not None:
            dbg.attach()
        try:
            for _ in range(12):
                x, y = torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)
                opt.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.mse_loss(model(x).float(), y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                losses.append(loss.item())
        finally:
            if dbg is not None:
                dbg.close()
        return model, losses, dbg

    plain, plain_losses, _ = train(False)
    model, losses, dbg = train(True)
    assert losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), model.parameters()))
    assert dbg is not None
    assert recorded(dbg) == pytest.approx(losses, rel=1e-5)  # not 1024 times larger


def fit_logged(tmp_path: Any, batches: int, epochs: int, accumulate: int) -> tuple[NeuralDbg, list[float], Any]:
    """The small Lightning classifier fitted under NeuralDBG with ``accumulate_grad_batches``: the debugger, the loss
    of each micro-batch as its ``training_step`` computed it (plain torch), and the trainer."""
    pytest.importorskip("lightning.pytorch")
    import lightning.pytorch as pl

    classes = kit("lightning.pytorch")
    seen: list[float] = []

    class Logged(classes.Classifier):  # type: ignore[misc,name-defined]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            seen.append(float(loss.detach()))
            return loss

    torch.manual_seed(0)
    module = Logged()
    trainer = quiet_trainer(pl, tmp_path, max_epochs=epochs, accumulate_grad_batches=accumulate)
    with NeuralDbg(module) as dbg:
        trainer.fit(module, make_loader(batches))
    return dbg, seen, trainer


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")
@pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated")
def test_the_loss_of_a_lightning_step_with_accumulation_is_the_mean_of_its_micro_batches(tmp_path: Any):
    dbg, seen, _ = fit_logged(tmp_path, batches=16, epochs=1, accumulate=2)
    # plain torch: 16 batches, 8 optimizer steps; each step's loss is the mean of its two batches' losses
    expected = [(seen[i] + seen[i + 1]) / 2 for i in range(0, 16, 2)]
    assert dbg.steps == 8
    assert recorded(dbg) == pytest.approx(expected, rel=1e-5)


def test_the_loss_of_an_hf_trainer_step_with_accumulation_is_the_loss_it_logs(tmp_path: Any):
    pytest.importorskip("transformers")
    from hf_support import Tokens, bert_classifier, logged, train

    model = bert_classifier()
    with NeuralDbg(model) as dbg:
        trainer = train(model, Tokens("class"), tmp_path, max_steps=12, logging_steps=1, gradient_accumulation_steps=2)
    # the Trainer logs, per optimizer step, the mean of its micro-batches' losses (rounded to 4 digits)
    expected = logged(trainer, "loss")
    assert len(expected) == 12 and dbg.steps == 12
    assert recorded(dbg) == pytest.approx(expected, abs=1e-3)


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")
@pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated")
def test_the_partial_step_that_ends_a_lightning_epoch_under_accumulation_is_left_out_of_the_loss_curve(tmp_path: Any):
    # Lightning steps the optimizer at an epoch's end on the micro-batches left, each loss still divided by
    # accumulate_grad_batches: that step's recorded loss is a fraction of a step's (hunt 18: 0.32 among losses of
    # 1.3 once an epoch, which pulled a shuffled-label run's loss under the band of chance)
    dbg, seen, trainer = fit_logged(tmp_path, batches=18, epochs=2, accumulate=4)
    # plain torch: 18 batches an epoch, steps of 4, 4, 4, 4 and 2 micro-batches; the last holds half of a step's
    # loss (two losses divided by 4)
    assert trainer.global_step == dbg.steps == 10
    whole = [sum(seen[e * 18 + i : e * 18 + i + 4]) / 4 for e in range(2) for i in range(0, 16, 4)]
    assert recorded(dbg) == pytest.approx(whole, rel=1e-5)
    assert dbg._recorder.coverage.partial_losses == 2
