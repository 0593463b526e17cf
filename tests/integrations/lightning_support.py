"""A small Lightning project for the callback's tests, and plain-torch ground truth about what it trains.

Everything is built for one Lightning package at a time (``lightning.pytorch`` or ``pytorch_lightning``: a Trainer
accepts the modules and callbacks of its own package); :func:`kit` returns the classes for one.

Ground truth never comes from NeuralDBG: :class:`Truth` records, with plain torch, which parameters really changed
at each optimizer step, the gradient norm before clipping, how many batches trained and validated, and which
training batch held a NaN; :class:`ReluWatch` measures a ReLU's activity on every training batch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCH = 32
FEATURES = 16


def make_loader(batches: int, *, nan_at: int | None = None, seed: int = 0) -> DataLoader:
    """A learnable binary classification task in ``batches`` batches, in order; ``nan_at``: that batch gets a NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batches * BATCH, FEATURES, generator=g)
    y = (x @ torch.randn(FEATURES, generator=g)).gt(0).long()
    if nan_at is not None:
        x[nan_at * BATCH + 3, 5] = float("nan")
    return DataLoader(TensorDataset(x, y), batch_size=BATCH)


def quiet_trainer(pl: ModuleType, tmp_path: Any, **options: Any) -> Any:
    """A CPU Trainer that writes only under ``tmp_path`` and prints no progress bar or model summary."""
    settings: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": str(tmp_path),
    }
    settings.update(options)
    return pl.Trainer(**settings)


@dataclass
class StepRecord:
    global_step: int  # trainer.global_step while the batch trained (the number of the optimizer step it feeds)
    moved: set[str] = field(default_factory=set)  # parameters whose values changed at this optimizer step
    update_ratio: dict[str, float] = field(default_factory=dict)  # ||W_after - W_before|| / ||W_before||
    grad_norm: float = math.nan  # total gradient norm before clipping


class ReluWatch:
    """Plain torch: per training batch, the fraction of a ReLU's units that are positive on no sample."""

    def __init__(self, relu: nn.Module) -> None:
        self.dead_fractions: list[float] = []
        self._handle = relu.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: Any, output: torch.Tensor) -> None:
        if torch.is_grad_enabled() and module.training:
            alive = (output.detach() > 0).any(dim=0)
            self.dead_fractions.append(1.0 - alive.float().mean().item())

    def first_fully_dead(self) -> int | None:
        return next((i for i, f in enumerate(self.dead_fractions) if f == 1.0), None)

    def remove(self) -> None:
        self._handle.remove()


@functools.cache
def kit(package: str = "lightning.pytorch") -> SimpleNamespace:
    """``Classifier``, ``TwoOptimizers`` and ``Truth`` for the Lightning package named ``package``."""
    pl = __import__(package, fromlist=["Callback"])

    class Classifier(pl.LightningModule):
        """An MLP classifier: ``net`` (Linear-ReLU-Linear-ReLU) then ``head``; Adam 1e-3 unless told otherwise."""

        def __init__(
            self,
            *,
            optimizer: str = "adam",
            lr: float = 1e-3,
            head_in_optimizer: bool = True,
            manual: bool = False,
            direct: bool = False,
            fail_at: int | None = None,
            interrupt_at: int | None = None,
        ) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
            self.head = nn.Linear(64, 2)
            self.optimizer, self.lr, self.head_in_optimizer = optimizer, lr, head_in_optimizer
            self.automatic_optimization = not manual
            self.direct = direct  # training_step calls the submodules, not self(x): common in LightningModules
            self.fail_at, self.interrupt_at = fail_at, interrupt_at
            self.output_dtypes: list[torch.dtype] = []
            self.validation_batches = 0
            self.validation_nan = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.net(x))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == self.fail_at:
                raise RuntimeError("a bug in training_step")
            if batch_idx == self.interrupt_at:
                raise KeyboardInterrupt
            x, y = batch
            logits = self.head(self.net(x)) if self.direct else self(x)
            self.output_dtypes.append(logits.dtype)
            loss = nn.functional.cross_entropy(logits, y)
            if self.automatic_optimization:
                return loss
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
            return None

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.validation_batches += 1
            self.validation_nan |= bool(torch.isnan(nn.functional.cross_entropy(self(x), y)))

        def configure_optimizers(self) -> Any:
            params = self.parameters() if self.head_in_optimizer else self.net.parameters()
            if self.optimizer == "sgd":
                return torch.optim.SGD(params, lr=self.lr)
            return torch.optim.Adam(params, lr=self.lr)

    class TwoOptimizers(Classifier):
        """Manual optimisation with one optimizer for ``net`` and one for ``head``, both stepping every batch."""

        def __init__(self) -> None:
            super().__init__(manual=True)

        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            net_opt, head_opt = self.optimizers()
            loss = nn.functional.cross_entropy(self(x), y)
            net_opt.zero_grad()
            head_opt.zero_grad()
            self.manual_backward(loss)
            net_opt.step()
            head_opt.step()

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.net.parameters(), lr=1e-3), torch.optim.SGD(self.head.parameters(), lr=0.1)

    class Truth(pl.Callback):
        """Plain torch, through Lightning's own hooks: per optimizer step, which parameters changed (a copy taken
        before the step, compared after the batch) and the gradient norm before clipping; and which training
        batch, numbered by ``trainer.global_step``, held a NaN."""

        def __init__(self) -> None:
            self.steps: list[StepRecord] = []
            self.batches = 0
            self.nan_at_global_step: list[int] = []
            self._before: dict[str, torch.Tensor] | None = None

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.batches += 1
            if torch.isnan(batch[0]).any():
                self.nan_at_global_step.append(trainer.global_step)

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            record = StepRecord(trainer.global_step)
            record.grad_norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
            self.steps.append(record)
            self._before = {n: p.detach().clone() for n, p in pl_module.named_parameters()}

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if self._before is None:
                return  # a micro-batch of gradient accumulation: no optimizer step yet
            for name, p in pl_module.named_parameters():
                before = self._before[name]
                if not torch.equal(p.detach(), before):
                    self.steps[-1].moved.add(name)
                self.steps[-1].update_ratio[name] = float((p.detach() - before).norm() / before.norm())
            self._before = None

        def parameters_that_never_moved(self, pl_module: Any) -> set[str]:
            names = {n for n, _ in pl_module.named_parameters()}
            return names - set().union(*(s.moved for s in self.steps))

        def every_parameter_moved_at_every_step(self, pl_module: Any) -> bool:
            names = {n for n, _ in pl_module.named_parameters()}
            return bool(self.steps) and all(s.moved == names for s in self.steps)

    return SimpleNamespace(pl=pl, Classifier=Classifier, TwoOptimizers=TwoOptimizers, Truth=Truth)


def kill_relu(model: Any) -> None:
    """A bias of -20 before ``net.3``: its units are negative for every input (the test confirms it)."""
    with torch.no_grad():
        model.net[2].bias.fill_(-20.0)
