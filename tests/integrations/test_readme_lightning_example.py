"""The README's Lightning example: a complete test file, run by the suite as it is printed there."""

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from neuraldbg.integrations.lightning import NeuralDbgCallback
from pytest_neuraldbg import assert_healthy, assert_parameters_update


class Classifier(L.LightningModule):
    def __init__(self, train_head=True):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 2)
        self.train_head = train_head

    def forward(self, x):
        return self.head(self.net(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        params = self.parameters() if self.train_head else self.net.parameters()
        return torch.optim.Adam(params, lr=1e-3)


def make_loader(batches=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batches * 32, 16, generator=g)
    y = (x @ torch.randn(16, generator=g)).gt(0).long()
    return DataLoader(TensorDataset(x, y), batch_size=32)


def make_trainer(tmp_path, *callbacks, **options):
    options = {"max_steps": 60, **options}
    return L.Trainer(
        accelerator="cpu",
        callbacks=list(callbacks),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
        **options,
    )


def test_the_classifier_trains_healthily(neuraldbg, tmp_path):
    torch.manual_seed(0)
    model = Classifier()
    ndbg = neuraldbg(model)  # the fixture's debugger: in the test's reports, gate and baseline
    make_trainer(tmp_path, NeuralDbgCallback(ndbg)).fit(model, make_loader())
    assert_healthy(ndbg)


def test_accumulation_and_clipping_keep_it_healthy(neuraldbg, tmp_path):
    torch.manual_seed(0)
    model = Classifier()
    ndbg = neuraldbg(model)
    options = {"max_steps": 15, "accumulate_grad_batches": 4, "gradient_clip_val": 1.0}
    trainer = make_trainer(tmp_path, NeuralDbgCallback(ndbg), **options)
    trainer.fit(model, make_loader())
    assert ndbg.steps == trainer.global_step == 15  # optimizer steps, as Lightning counts them
    assert_healthy(ndbg)


def test_a_head_left_out_of_the_optimizer_is_caught(neuraldbg, tmp_path):
    torch.manual_seed(0)
    model = Classifier(train_head=False)
    ndbg = neuraldbg(model)
    make_trainer(tmp_path, NeuralDbgCallback(ndbg)).fit(model, make_loader())
    with pytest.raises(AssertionError, match="frozen_parameters at 'head' from step 0"):
        assert_parameters_update(ndbg)


def test_a_with_block_around_fit_works_too(neuraldbg, tmp_path):
    torch.manual_seed(0)
    model = Classifier()
    with neuraldbg(model) as ndbg:
        make_trainer(tmp_path).fit(model, make_loader())
    assert not ndbg.explain_failure()
