"""The shape every diagnosis scenario shares.

A scenario is a small, deterministic training run with a known ground truth. ``build()`` returns a fresh
:class:`Run` (model, optimizers, batches, loss) every time it is called; the diagnosis benchmark wraps
``run.train()`` in ``NeuralDbg(run.model)`` exactly as a user wraps their own loop, and compares what the
engine says with :class:`GroundTruth`.

Step numbering, used by every onset range: step ``k`` is the ``k``-th (0-based) iteration of the training
loop, i.e. the forward and backward pass that precede the ``k``-th ``optimizer.step()``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

#: The public failure vocabulary (values of ``neuraldbg.FailureKind``).
KINDS = frozenset(
    {
        "vanishing_gradients",
        "exploding_gradients",
        "dead_neurons",
        "saturated_activations",
        "non_finite",
        "frozen_parameters",
        "stalled_updates",
        "gradients_not_zeroed",
    }
)

Batch = tuple[torch.Tensor, torch.Tensor]
StepProbe = Callable[[int, nn.Module, torch.Tensor], None]


@dataclass(frozen=True)
class GroundTruth:
    """What a correct diagnosis of a scenario says.

    kinds: failure kinds a correct diagnosis must name (empty for a healthy run).
    may_also: kinds it may also name because they are true side effects of the fault.
    root_layers: acceptable root layers (qualified names from ``model.named_modules()``, ``""`` for the
        model as a whole or its input), or ``None`` where the root is not well defined.
    onset: acceptable first step of the root cause, inclusive, or ``None`` where not well defined.
    evidence: one sentence on how the truth was checked with plain torch (see ``benchmarks/evidence.py``).
    """

    kinds: frozenset[str] = frozenset()
    may_also: frozenset[str] = frozenset()
    root_layers: frozenset[str] | None = None
    onset: tuple[int, int] | None = None
    evidence: str = ""

    def __post_init__(self) -> None:
        unknown = (self.kinds | self.may_also) - KINDS
        if unknown:
            raise ValueError(f"unknown failure kinds {sorted(unknown)}; expected a subset of {sorted(KINDS)}")

    @property
    def healthy(self) -> bool:
        return not self.kinds


@dataclass
class Run:
    """One built scenario: everything a training loop needs, and the loop itself.

    ``train()`` is a plain PyTorch loop. Scenarios with unusual loops (gradient accumulation, several
    optimizers, a learning-rate change mid-run) pass their own ``loop``.
    """

    model: nn.Module
    optimizers: list[torch.optim.Optimizer]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batch: Callable[[int], Batch]
    steps: int
    loop: Callable[[Run, StepProbe | None], None] | None = None

    def train(self, probe: StepProbe | None = None) -> None:
        """Run the training loop; ``probe(step, model, loss)`` is called after each backward pass."""
        if self.loop is not None:
            self.loop(self, probe)
            return
        for step in range(self.steps):
            inputs, targets = self.batch(step)
            for opt in self.optimizers:
                opt.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model(inputs), targets)
            loss.backward()
            if probe is not None:
                probe(step, self.model, loss.detach())
            for opt in self.optimizers:
                opt.step()


@dataclass(frozen=True)
class Scenario:
    """A named, deterministic training run with its ground truth."""

    name: str
    arch: str  # "tiny", "mlp", "cnn", "resnet", "rnn", "transformer"
    description: str
    truth: GroundTruth
    build: Callable[[], Run] = field(repr=False)
