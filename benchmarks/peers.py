"""NeuralDBG next to other ways of watching a training run, measured in one process the same way.

    python -m benchmarks.peers                  # every model of benchmarks.overhead (several minutes on 2 cores)
    python -m benchmarks.peers --model tiny     # one model
    python -m benchmarks.overhead --peers       # the same tables

The monitors, each attached to its own copy of the model (same initial weights, same batches, one torch thread):

* ``neuraldbg``: ``NeuralDbg(model)`` with the default preset;
* ``bound``: the hand-written lower bound of a per-layer monitor: one forward hook per leaf module that does
  nothing, and one ``torch._foreach_norm`` over every gradient per step (nothing read back);
* ``checks_floor``: the issue's two every-step duties done by hand and nothing else, dating a non-finite gradient
  at its step and recording the loss curve: the gradients' norms (one ``torch._foreach_norm``), summed and read on
  the host, and the loss read, each step; no module hook, nothing kept but those two numbers;
* ``detect_anomaly``: ``torch.autograd.set_detect_anomaly(True)`` around the monitor's own steps;
* ``lightning_grad_norm``: ``lightning.pytorch.utilities.grad_norm(model, 2)`` after each backward pass (what a
  ``LightningModule.on_before_optimizer_step`` computes before logging), when Lightning is installed;
* ``wandb_watch``: ``wandb.watch(model, log="gradients", log_freq=100)`` in an offline run with ``wandb.log`` each
  step, when wandb is installed.

Two figures per monitor: **steady**, alternating blocks of steps after a warm-up (each monitor attached, untimed,
for its own blocks only, the order rotating every round; the median over rounds of a monitored block over the
plain block of the same round), and **first 50**, fresh copies trained 50 steps each in rotating order (the
median, over repeats, of a monitored run over the plain run of the same repeat). Attaching and NeuralDBG's
diagnosis at exit (``close()`` and ``hypotheses()``) are outside the first-50 ratio and printed apart. Times are
the thread's CPU time (``time.thread_time``): with one torch thread all the work runs on it, and time the process
waits for a core on a shared machine is not counted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from neuraldbg import NeuralDbg  # noqa: E402

from .overhead import CASES, Case, _fixture, finish_steps, load_average  # noqa: E402

Batches = list[tuple[torch.Tensor, torch.Tensor]]


class Monitor:
    """A way of watching one model: ``attach`` before its steps, ``after_backward`` each step (given the step's
    loss), ``finish`` after them (what is left of their work), ``detach`` last (what a run does once)."""

    name = "plain"

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def attach(self) -> None:
        pass

    def after_backward(self, loss: torch.Tensor) -> None:
        pass

    def finish(self) -> None:
        pass

    def detach(self) -> None:
        pass

    def diagnose(self) -> None:
        pass


class Debugger(Monitor):
    name = "neuraldbg"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.dbg = NeuralDbg(model)

    def attach(self) -> None:
        self.dbg.attach()

    def finish(self) -> None:
        finish_steps(self.dbg)

    def detach(self) -> None:
        self.dbg.close()

    def diagnose(self) -> None:
        self.dbg.hypotheses()


class Bound(Monitor):
    """One no-op forward hook per leaf module and one ``_foreach_norm`` of all gradients per step."""

    name = "bound"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.leaves = [m for m in model.modules() if not any(True for _ in m.children())]
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.handles: list[Any] = []
        self.norms: list[torch.Tensor] = []

    def attach(self) -> None:
        self.handles = [m.register_forward_hook(_nothing) for m in self.leaves]

    def after_backward(self, loss: torch.Tensor) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        self.norms = list(torch._foreach_norm(grads))

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def _nothing(module: nn.Module, args: Any, output: Any) -> None:
    return None


class ChecksFloor(Monitor):
    """The two readings every step owes, done by hand and nothing else: whether every gradient is finite (their
    norms summed, read on the host: a NaN or inf in any gradient makes the sum non-finite), dated at its step, and
    the loss's value for the curve. What keeping those duties costs, done the straightforward way."""

    name = "checks_floor"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.step = 0
        self.losses: list[float] = []
        self.nonfinite_steps: list[int] = []

    def after_backward(self, loss: torch.Tensor) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        total = torch.stack(torch._foreach_norm(grads)).sum().item()
        if not math.isfinite(total):
            self.nonfinite_steps.append(self.step)
        self.losses.append(loss.item())
        self.step += 1


class Anomaly(Monitor):
    name = "detect_anomaly"

    def attach(self) -> None:
        torch.autograd.set_detect_anomaly(True)

    def detach(self) -> None:
        torch.autograd.set_detect_anomaly(False)


class LightningGradNorm(Monitor):
    name = "lightning_grad_norm"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        from lightning.pytorch.utilities import grad_norm

        self.grad_norm = grad_norm
        self.norms: dict[str, torch.Tensor] = {}

    def after_backward(self, loss: torch.Tensor) -> None:
        self.norms = self.grad_norm(self.model, norm_type=2)


class WandbWatch(Monitor):  # pragma: no cover - runs only where wandb is installed
    name = "wandb_watch"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        import wandb

        self.wandb = wandb
        # its offline runs go to a directory of their own, removed at exit: not a wandb/ folder in the checkout
        self.run = wandb.init(mode="offline", reinit=True, project="neuraldbg-peers", dir=_wandb_dir())

    def attach(self) -> None:
        self.wandb.watch(self.model, log="gradients", log_freq=100)

    def after_backward(self, loss: torch.Tensor) -> None:
        self.wandb.log({})

    def detach(self) -> None:
        self.wandb.unwatch(self.model)


_WANDB_DIR: list[tempfile.TemporaryDirectory[str]] = []


def _wandb_dir() -> str:  # pragma: no cover - runs only where wandb is installed
    """One temporary directory for every offline wandb run of this process (deleted when the process ends)."""
    if not _WANDB_DIR:
        _WANDB_DIR.append(tempfile.TemporaryDirectory(prefix="neuraldbg-peers-wandb-"))
    return _WANDB_DIR[0].name


def monitors() -> list[type[Monitor]]:
    """The monitors this environment can run, the plain loop first."""
    found: list[type[Monitor]] = [Monitor, Debugger, Bound, ChecksFloor, Anomaly]
    if importlib.util.find_spec("lightning") is not None:
        found.append(LightningGradNorm)
    if importlib.util.find_spec("wandb") is not None:  # pragma: no cover
        found.append(WandbWatch)
    return found


class Copy:
    """One copy of the model, its optimizer and its monitor."""

    def __init__(self, case: Case, state: dict[str, torch.Tensor], kind: type[Monitor]) -> None:
        self.model = case.build()
        self.model.load_state_dict(state)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.loss = case.loss
        self.monitor = kind(self.model)
        self.steps = 0

    def train(self, batches: Batches, n: int) -> None:
        monitor = self.monitor
        for i in range(self.steps, self.steps + n):
            x, y = batches[i % len(batches)]
            self.opt.zero_grad(set_to_none=True)
            loss = self.loss(self.model(x), y)
            loss.backward()
            monitor.after_backward(loss)
            self.opt.step()
        self.steps += n

    def block(self, batches: Batches, n: int) -> float:
        """CPU seconds per step of ``n`` steps with what is left of their work (``finish``); attaching the monitor
        and detaching it are not timed (a run does each once: see benchmarks.overhead's ``Runner.run``)."""
        self.monitor.attach()
        t0 = time.thread_time()
        self.train(batches, n)
        self.monitor.finish()
        seconds = (time.thread_time() - t0) / n
        self.monitor.detach()
        return seconds


def steady(case: Case, kinds: list[type[Monitor]], warmup: int, rounds: int) -> dict[str, float]:
    state, batches = _fixture(case)
    copies = [Copy(case, state, kind) for kind in kinds]
    for c in copies:
        c.block(batches, warmup)
    times: dict[str, list[float]] = {c.monitor.name: [] for c in copies}
    for round_ in range(rounds):
        shift = round_ % len(copies)
        for c in copies[shift:] + copies[:shift]:
            times[c.monitor.name].append(c.block(batches, case.block))
    plain = times["plain"]
    return {name: statistics.median(t / p for t, p in zip(ts, plain, strict=True)) for name, ts in times.items()}


def first(case: Case, kinds: list[type[Monitor]], repeats: int, n: int = 50) -> dict[str, float]:
    """Ratios over the first ``n`` steps of fresh copies, plus NeuralDBG's attach and diagnosis (ms)."""
    state, batches = _fixture(case)
    ratios: dict[str, list[float]] = {kind.name: [] for kind in kinds}
    attach: list[float] = []
    diagnosis: list[float] = []
    for repeat in range(repeats):
        shift = repeat % len(kinds)
        times: dict[str, float] = {}
        for kind in kinds[shift:] + kinds[:shift]:
            t0 = time.thread_time()
            c = Copy(case, state, kind)
            c.monitor.attach()
            t1 = time.thread_time()
            c.train(batches, n)
            t2 = time.thread_time()
            c.monitor.detach()
            c.monitor.diagnose()
            t3 = time.thread_time()
            times[kind.name] = t2 - t1
            if kind is Debugger:
                build = time.thread_time()
                case.build()  # the model's own construction, taken out of the attach figure
                attach.append(t1 - t0 - (time.thread_time() - build))
                diagnosis.append(t3 - t2)
        for name, t in times.items():
            ratios[name].append(t / times["plain"])
    result = {name: statistics.median(r) for name, r in ratios.items()}
    if attach:
        result["attach_ms"] = statistics.median(attach) * 1e3
        result["diagnosis_ms"] = statistics.median(diagnosis) * 1e3
    return result


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


REPEATS = {"tiny": 30, "mlp": 8, "cnn": 4, "transformer": 8, "deep": 8, "many": 2}


def table(models: list[str] | None, quick: bool, out: Callable[[str], None] = print) -> None:
    kinds = monitors()
    names = [k.name for k in kinds[1:]]
    rounds = 6 if quick else 30
    with _one_thread():
        out(f"torch {torch.__version__}, 1 thread, {os.cpu_count()} CPUs, load average {load_average()}")
        if not any(k.name == "wandb_watch" for k in kinds):
            out("wandb: not installed, not measured")
        out("")
        out("| model | " + " | ".join(f"{n} steady / first 50" for n in names) + " | attach | diagnosis at exit |")
        out("|---|" + "---|" * (len(names) + 2))
        for case in CASES:
            short = case.build.__name__
            if (models and short not in models) or (not models and short == "many"):
                continue  # the 5,000-tensor model only when asked for: its rounds take minutes
            s = steady(case, kinds, 20 if quick else 260, rounds)  # warm-up: past the early, denser schedule
            f = first(case, kinds, max(2, REPEATS[short] // (4 if quick else 1)))
            cells = " | ".join(f"{s[n]:.2f}x / {f[n]:.2f}x" for n in names)
            out(f"| {short} | {cells} | {f['attach_ms']:.1f} ms | {f['diagnosis_ms']:.1f} ms |")
        out(f"load average at the end: {load_average()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke run")
    parser.add_argument(
        "--model",
        choices=["tiny", "mlp", "cnn", "transformer", "deep", "many"],
        action="append",
        help="only these models (the 5,000-tensor model only when named)",
    )
    args = parser.parse_args(argv)
    table(args.model, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
