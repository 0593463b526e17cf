"""A small Hugging Face project for the Trainer callback's tests, and plain-torch ground truth about what it trains.

Tiny models from configs (no download, no tokenizer): a BERT classifier (2 layers, hidden 64), a GPT-2 language
model and a GPT-2 regressor. Tasks are learnable in tens of steps, so a healthy run really trains.

Ground truth never comes from NeuralDBG: :class:`Truth` records, with plain torch, which parameters changed at each
optimizer step, the gradient norm reaching the optimizer (after the Trainer's clipping), every training forward pass
and the ``state.global_step`` of each batch whose labels held a NaN.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here downloads; make sure nothing tries

VOCAB = 64
SEQ = 12
BATCH = 16


class Tokens(Dataset):
    """Random token sequences, labelled so a tiny model learns fast.

    ``task``: ``"class"`` (label: is the first token in the upper half of the vocabulary), ``"lm"`` (each token is
    the previous one plus one: next-token prediction is learnable), ``"regression"`` (the first token scaled to
    [0, 1)). ``nan_at``: index of one sample whose regression label is NaN.
    """

    def __init__(self, task: str, n: int = 1280, *, nan_at: int | None = None, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.task = task
        if task == "lm":
            start = torch.randint(0, VOCAB, (n, 1), generator=g)
            self.ids = (start + torch.arange(SEQ)) % VOCAB
        else:
            self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.labels: torch.Tensor
        if task == "class":
            self.labels = (self.ids[:, 0] >= VOCAB // 2).long()
        elif task == "regression":
            self.labels = self.ids[:, 0].float() / VOCAB
            if nan_at is not None:
                self.labels[nan_at] = float("nan")
        else:
            self.labels = self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def bert_classifier(vocab: int = VOCAB, positions: int = SEQ, labels: int = 2) -> Any:
    """A tiny BERT classifier (2 layers, hidden 64), seeded 0."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=positions,
        num_labels=labels,
    )
    return BertForSequenceClassification(config)


def _gpt2_config(**options: Any) -> Any:
    return GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=2, n_positions=SEQ, **options)


def gpt2_lm() -> Any:
    torch.manual_seed(0)
    return GPT2LMHeadModel(_gpt2_config(bos_token_id=0, eos_token_id=0))


def gpt2_regressor() -> Any:
    torch.manual_seed(0)
    return GPT2ForSequenceClassification(_gpt2_config(num_labels=1, pad_token_id=0, bos_token_id=0, eos_token_id=0))


def arguments(tmp_path: Any, **options: Any) -> Any:
    """CPU TrainingArguments that write only under ``tmp_path``, report to nothing, save nothing, print no bar."""
    settings: dict[str, Any] = {
        "output_dir": str(tmp_path),
        "max_steps": 40,
        "per_device_train_batch_size": BATCH,
        "learning_rate": 1e-3,
        "logging_steps": 5,
        "report_to": [],
        "save_strategy": "no",
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": 0,
    }
    settings.update(options)
    return TrainingArguments(**settings)


@dataclass
class StepRecord:
    global_step: int
    moved: set[str] = field(default_factory=set)  # parameters whose values changed at this optimizer step
    grad_norm: float = math.nan  # total gradient norm reaching the optimizer (after the Trainer's clipping)


class Truth(TrainerCallback):
    """Plain torch around the Trainer's steps: a copy of every parameter before each step, compared after it; the
    gradient norm at ``optimizer.step()``; a forward pre-hook counting training forwards and finding NaN labels."""

    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        self.forwards = 0
        self.nan_at_global_step: list[int] = []
        # autocast dtype inside training forwards (None: off); read in the model's first child, because accelerate
        # enters autocast inside the model's forward, after the model's own forward pre-hooks have run
        self.autocast: set[torch.dtype | None] = set()
        self._state: Any = None
        self._before: dict[str, torch.Tensor] = {}
        self._handles: list[Any] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._state = state
        self._handles = [
            model.register_forward_pre_hook(self._forward, with_kwargs=True),
            next(model.children()).register_forward_pre_hook(self._inside),
        ]

    def _forward(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if torch.is_grad_enabled() and module.training:
            self.forwards += 1
            labels = kwargs.get("labels")
            if labels is not None and labels.is_floating_point() and torch.isnan(labels).any():
                self.nan_at_global_step.append(self._state.global_step)

    def _inside(self, module: Any, args: Any) -> None:
        if torch.is_grad_enabled() and module.training:
            on = torch.is_autocast_enabled("cpu")
            self.autocast.add(torch.get_autocast_dtype("cpu") if on else None)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
        self.steps.append(StepRecord(state.global_step, grad_norm=float(torch.linalg.vector_norm(torch.stack(grads)))))

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        for name, p in model.named_parameters():
            if not torch.equal(p.detach(), self._before[name]):
                self.steps[-1].moved.add(name)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for handle in self._handles:
            handle.remove()

    def parameters_that_never_moved(self, model: Any) -> set[str]:
        return {n for n, _ in model.named_parameters()} - set().union(*(s.moved for s in self.steps))

    def every_parameter_moved_at_every_step(self, model: Any) -> bool:
        names = {n for n, _ in model.named_parameters()}
        return bool(self.steps) and all(s.moved == names for s in self.steps)


def train(model: Any, data: Any, tmp_path: Any, *callbacks: Any, optimizer: Any = None, **options: Any) -> Any:
    """Train with the given callbacks (in order); returns the Trainer."""
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, **options),
        train_dataset=data,
        callbacks=list(callbacks),
        optimizers=(optimizer, None),
    )
    trainer.train()
    return trainer


def logged(trainer: Any, key: str) -> list[float]:
    """Every value the Trainer logged under ``key`` (the loss, the gradient norm before clipping)."""
    return [entry[key] for entry in trainer.state.log_history if key in entry]
