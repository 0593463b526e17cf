"""What every program of the real-programs benchmark shares: its variants, and the session its loop reports to.

A *program* is a small but faithful version of a training script as people write it (the structure of
pytorch/examples, of a Hugging Face or Lightning tutorial). Its training function takes the program's settings
(``hp``, the defaults with a variant's changes applied) and a :class:`Session`, trains, evaluates on held-out
data with the program's own correct evaluation, and returns the task metric.

The loop is the same in every mode; only the session differs:

* ``plain``: nothing is attached (ground truth, the seeds other than the first);
* ``probe``: plain torch hooks record the evidence of :mod:`benchmarks.real.probe` (ground truth, first seed);
* ``neuraldbg``: ``with NeuralDbg(model) as dbg:`` around the loop, or the framework's NeuralDBG callback.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

#: Failure kinds a ground-truth set may name, written apart from the engine (today the same set as its registry's).
KINDS = frozenset(
    {
        "vanishing_gradients",
        "exploding_gradients",
        "dead_neurons",
        "saturated_activations",
        "non_finite",
        "frozen_parameters",
        "stalled_updates",
        "no_training_observed",
        "no_gradient",
        "eval_mode_training",
        "degenerate_loss",
        "incomplete_observation",
        "loss_scale_collapse",
        "gradients_not_zeroed",
        "discarded_gradients",
        "optimizer_reset",
        "loss_not_decreasing",
        "unstable_loss",
        "loss_at_chance",
        "oversized_updates",
        "activation_before_loss",
        "unnormalised_inputs",
        "class_index_regression",
        "collapsed_output",
        "labels_shifted_twice",
        "labels_on_padding",
        "inverted_padding_mask",
        "missing_causal_mask",
        "module_requires_grad",
        "view_across_batch",
        "oversized_logits",
        "unmasked_padding",
        "missing_log_softmax",
        "missing_sigmoid",
        "detached_layers",
        "excessive_weight_decay",
        "excessive_dropout",
        "symmetric_units",
        "broadcast_loss",
        "no_nonlinearity",
        "unshuffled_data",
        "unreachable_targets",
        "advantage_not_detached",
        "attention_across_batch",
    }
)

HEALTHY = "healthy"


@dataclass(frozen=True)
class Variant:
    """One version of a program: the program as written (``healthy``) or a mutant of it.

    change: the settings this variant overrides (the training function reads them from ``hp``).
    operator: the operator family (DeepCrime's training mutation operators, plus the classic bugs).
    kinds: the failure kinds that name this fault correctly *if* plain torch shows it harmful (the ground
        truth adds the kinds whose symptom plain torch measures: NaN, exploding gradients, dead units, frozen
        parameters).
    root: the layers where the fault lives (names from the watched model's ``named_modules()``), or empty
        where it has none (a learning rate, a loss, the data).
    """

    name: str
    operator: str
    description: str
    change: dict[str, Any] = field(default_factory=dict)
    kinds: frozenset[str] = frozenset()
    root: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = self.kinds - KINDS
        if unknown:
            raise ValueError(f"variant {self.name}: unknown kinds {sorted(unknown)}")


def healthy(description: str) -> Variant:
    return Variant(HEALTHY, "none", description)


@dataclass(frozen=True)
class Program:
    """A training script and its variants.

    metric: the name of the task metric the training function returns under ``"metric"``.
    higher_is_better: its direction. floor: the smallest deficit that counts as harm even when the healthy
        twin's seeds agree closely (absolute, or relative to the twin's mean when ``relative_floor``).
    chance: the metric of a model that learned nothing (to check that the healthy twin learns); None where
        there is no such number (the training loss must then fall).
    """

    family: str
    name: str
    train: Callable[[SimpleNamespace, Session], dict[str, float]]
    defaults: dict[str, Any]
    metric: str
    higher_is_better: bool
    floor: float
    chance: float | None
    variants: tuple[Variant, ...]
    relative_floor: bool = False
    functional_relu: tuple[str, ...] = ()  # modules whose output goes through F.relu (for the probe)

    def settings(self, variant: Variant, seed: int) -> SimpleNamespace:
        unknown = set(variant.change) - set(self.defaults)
        if unknown:
            raise KeyError(f"{self.name}.{variant.name}: unknown settings {sorted(unknown)}")
        return SimpleNamespace(**{**self.defaults, **variant.change, "seed": seed})


@dataclass(frozen=True)
class Case:
    program: Program
    variant: Variant

    @property
    def id(self) -> str:
        return f"{self.program.name}.{self.variant.name}"

    @property
    def family(self) -> str:
        return self.program.family


class Session:
    """What a training loop reports to: the loss of each step, and the models it trains (``watch``)."""

    def __init__(self, mode: str, observe_loss: bool = False) -> None:
        if mode not in ("plain", "probe", "neuraldbg"):
            raise ValueError(mode)
        self.mode = mode
        self.observe_loss = observe_loss
        self.losses: list[float] = []
        self.debuggers: list[Any] = []  # NeuralDbg objects, in neuraldbg mode
        self.probe: Any = None  # a benchmarks.real.probe.Probe, in probe mode
        self._framework: list[Any] = []  # framework callbacks whose debugger is read when the block ends
        self.relu_inputs: tuple[str, ...] = ()  # probe mode: modules whose output the program passes to F.relu

    def record(self, loss: torch.Tensor | float) -> None:
        """The loop calls this once per step with its loss (as it would log it). Under NeuralDBG it reaches the
        debugger only with ``observe_loss`` (``--observe-loss``): by default the debugger records the loss itself,
        from the backward pass, as it does in a user's loop that never names it."""
        value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        self.losses.append(value)
        if self.mode == "neuraldbg" and self.observe_loss:
            tensor = loss if isinstance(loss, torch.Tensor) else torch.tensor(value)
            for dbg in self._live_debuggers():
                dbg.observe_loss(tensor)

    def _live_debuggers(self) -> list[Any]:
        found = list(self.debuggers)
        for callback in self._framework:
            if callback.debugger is not None and callback.debugger not in found:
                found.append(callback.debugger)
        return found

    @contextlib.contextmanager
    def watch(
        self, *models: nn.Module, via: str | None = None, probe_also: tuple[nn.Module, ...] = ()
    ) -> Iterator[list[Any]]:
        """Wrap the training loop: ``with session.watch(model) as callbacks:``.

        via: ``"lightning"`` or ``"huggingface"`` when a framework trains the model; in neuraldbg mode the block
        then yields NeuralDBG's callback for the trainer instead of a with-block of its own (``[]`` otherwise).
        probe_also: modules the evidence probe should see besides ``models`` (layers a model holds in a plain
        list, which ``named_parameters()`` does not reach); NeuralDBG is given ``models`` only, as a user would.
        """
        if self.mode == "plain":
            yield []
            return
        if self.mode == "probe":
            from .probe import Probe

            self.probe = Probe((*models, *probe_also), self.relu_inputs)
            try:
                yield []
            finally:
                self.probe.close()
            return
        if via is not None:
            callback = _framework_callback(via)
            self._framework.append(callback)
            try:
                yield [callback]
            finally:
                if hasattr(callback, "close"):
                    callback.close()
                if callback.debugger is not None:
                    self.debuggers.append(callback.debugger)
            return
        from neuraldbg import NeuralDbg

        with contextlib.ExitStack() as stack:
            for model in models:
                self.debuggers.append(stack.enter_context(NeuralDbg(model)))
            yield []

    def hypotheses(self) -> list[Any]:
        """Every debugger's hypotheses, the most confident first (a GAN watches two models)."""
        found = [h for dbg in self.debuggers for h in dbg.hypotheses()]
        return sorted(found, key=lambda h: -h.confidence) if len(self.debuggers) > 1 else found


def _framework_callback(via: str) -> Any:
    if via == "lightning":
        from neuraldbg.integrations.lightning import NeuralDbgCallback

        return NeuralDbgCallback()
    if via == "huggingface":
        from neuraldbg.integrations.huggingface import NeuralDbgTrainerCallback

        return NeuralDbgTrainerCallback()
    raise ValueError(f"unknown framework {via!r}")


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    import random

    random.seed(seed)


def finite(x: float) -> float:
    """A metric as JSON can hold it: NaN and infinities become None-like sentinels upstream."""
    return x if math.isfinite(x) else float("nan")
