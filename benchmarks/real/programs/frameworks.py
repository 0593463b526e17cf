"""Programs trained by a framework: the Hugging Face ``Trainer`` and Lightning.

Trainer: the tiny BERT classifier of :mod:`.hf_text` under ``Trainer`` with ``TrainingArguments`` (AdamW, linear
decay, ``max_grad_norm`` 1.0), the way the text-classification tutorial runs it; under NeuralDBG it gets
``NeuralDbgTrainerCallback``. Lightning: a ``LightningModule`` CNN classifier (the Lightning MNIST example's
shape) trained by ``lightning.Trainer``; under NeuralDBG it gets ``NeuralDbgCallback``. The loss of each step
is read by a small logging callback of the framework, as a user logs it.
"""

from __future__ import annotations

import tempfile
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything
from ._common import accuracy, image_split, to_input
from .hf_text import bert_model, marker_sequences

# --- Hugging Face Trainer --------------------------------------------------------------------------------


class MarkerDataset(torch.utils.data.Dataset):
    def __init__(self, ids: torch.Tensor, labels: torch.Tensor) -> None:
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def trainer_train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    class LossLogger(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                session.record(float(logs["loss"]))

    seed_everything(hp.seed)
    ids, labels = marker_sequences(2560)
    model = bert_model(hp.seed)
    with tempfile.TemporaryDirectory() as out, session.watch(model, via="huggingface") as callbacks:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=32,
            num_train_epochs=5,
            learning_rate=hp.lr,
            weight_decay=hp.weight_decay,
            max_grad_norm=hp.max_grad_norm,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            seed=hp.seed,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=MarkerDataset(ids[:2048], labels[:2048]),
            callbacks=[LossLogger(), *callbacks],
        )
        trainer.remove_callback(PrinterCallback)  # the logs go to LossLogger, not to stdout
        trainer.train()
    model.eval()
    with torch.no_grad():
        pred = model(input_ids=ids[2048:]).logits.argmax(-1)
    return {"metric": float((pred == labels[2048:]).float().mean())}


HF_TRAINER = Program(
    family="hf_trainer",
    name="bert_trainer",
    train=trainer_train,
    defaults=dict(lr=1e-3, weight_decay=0.0, max_grad_norm=1.0),
    metric="held-out accuracy",
    higher_is_better=True,
    floor=0.03,
    chance=0.25,
    variants=(
        healthy("tiny BERT under transformers.Trainer, lr 1e-3, 5 epochs, batch 32"),
        Variant("lr_5", "learning_rate", "learning_rate=5 in TrainingArguments", {"lr": 5.0}, K.LR_FAR_TOO_HIGH),
        Variant(
            "max_grad_norm_1e-4",
            "gradient_clipping",
            "max_grad_norm=1e-4 (AdamW)",
            {"max_grad_norm": 1e-4},
            K.TINY_CLIPPING,
        ),
        Variant("weight_decay_10", "regularisation", "weight_decay=10", {"weight_decay": 10.0}, K.HUGE_DECAY),
    ),
)


# --- Lightning -------------------------------------------------------------------------------------------


def lightning_train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    import lightning as L

    class LitClassifier(L.LightningModule):
        def __init__(self, lr: float, relu_on_logits: bool) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
            self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
            self.fc1 = nn.Linear(32 * 4 * 4, 64)
            self.fc2 = nn.Linear(64, 10)
            self.lr, self.relu_on_logits = lr, relu_on_logits

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))
            return F.relu(x) if self.relu_on_logits else x

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=self.lr)

    class LossLogger(L.Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            session.record(outputs["loss"])

    seed_everything(hp.seed)
    x_train, y_train, x_test, y_test = image_split(2048, 1024)
    x_train, x_test = to_input(x_train), to_input(x_test)
    model = LitClassifier(hp.lr, hp.relu_on_logits)
    train_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x_train, y_train), batch_size=64, shuffle=True
    )
    with session.watch(model, via="lightning") as callbacks:
        trainer = L.Trainer(
            max_epochs=3,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accumulate_grad_batches=hp.accumulate,
            callbacks=[LossLogger(), *callbacks],
        )
        trainer.fit(model, train_loader)
    return {"metric": accuracy(model, x_test, y_test)}


LIGHTNING = Program(
    family="lightning",
    name="lightning_cnn",
    train=lightning_train,
    defaults=dict(lr=1e-3, relu_on_logits=False, accumulate=1),
    metric="held-out accuracy",
    higher_is_better=True,
    floor=0.03,
    chance=0.1,
    functional_relu=("conv1", "conv2", "fc1", "fc2"),
    variants=(
        healthy("LightningModule CNN (conv-pool x2, fc, fc), Adam 1e-3, lightning.Trainer 3 epochs"),
        Variant("lr_100x", "learning_rate", "Adam lr 0.1", {"lr": 0.1}, K.LR_FAR_TOO_HIGH),
        Variant(
            "relu_on_logits",
            "activation",
            "F.relu on fc2's output",
            {"relu_on_logits": True},
            K.RELU_ON_LOGITS,
            ("fc2",),
        ),
        Variant("accumulate_4", "batch_size", "accumulate_grad_batches=4", {"accumulate": 4}, K.CAPACITY),
    ),
)

PROGRAMS = (HF_TRAINER, LIGHTNING)
