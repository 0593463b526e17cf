"""The optimizer starts over at every step: most optimizer steps were taken by an optimizer that held no state
before them and kept per-parameter state after them (a momentum buffer, moment estimates), so what it carries from
one step to the next never builds up. The usual cause is the optimizer made inside the training loop
(``opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)`` before each batch), or its state cleared
there.

Counted exactly, at the optimizer step hooks (see :mod:`neuraldbg.capture.backward`): whether the optimizer's
``state`` was empty before its step and, after it, what it holds. SGD's momentum buffer then starts as each step's
own gradient, so every step is plain SGD's, about ``1 / (1 - momentum)`` times smaller than the run the settings
describe (momentum 0.9 made anew each batch: held-out accuracy 0.47-0.49 against 0.77 for the optimizer made once,
loss 1.32 against 0.50, a fall too slow for any statistic to call stalled). Adam's moment estimates start over too:
each step is its first, every parameter moving by about the learning rate in the sign of its gradient (sign
descent), whatever its gradient's history (harmless on an easy task: 0.79 against 0.77; the code is still not what
it says). Reported when at least :data:`MIN_STEPS` optimizer steps were taken and :data:`SHARE` of them started
over. An optimizer that keeps nothing between steps (SGD without momentum) starting over changes nothing and is not
counted; a run that makes a new optimizer for each phase or epoch starts over once in many steps.
"""

from __future__ import annotations

import math

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, num
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.OPTIMIZER_RESET

#: Optimizer steps, at least: a few steps tell nothing of a loop.
MIN_STEPS = 16
#: ... and at least this share of them taken by an optimizer that started over (one per step, after the first).
SHARE = 0.75


class OptimizerReset(Kind):
    name = KIND.value
    title = "optimizer reset every step"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        steps, reset = facts.optimizer_steps, coverage.reset_steps
        if steps < MIN_STEPS or reset < SHARE * steps or coverage.first_reset < 0:
            return None
        momentum = coverage.reset_momentum
        return run_event(
            KIND,
            coverage.first_reset,
            max(coverage.first_reset, coverage.last_step),
            coverage.reset_optimizer,
            reset=reset,
            optimizer_steps=steps,
            moments=float("exp_avg" in coverage.reset_state),
            **({"momentum": momentum} if math.isfinite(momentum) else {}),
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(0, order=4)  # with the loop's other slips (zero_grad, step)

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        name = f" ({root.detail})" if root.detail else ""
        what = (
            f"The optimizer starts over at every step: {count(m.get('reset', 0.0))} of the "
            f"{count(m.get('optimizer_steps', 0.0))} optimizer steps were taken by an optimizer{name} that held no "
            "state before them (a new optimizer made inside the training loop, or its state cleared there), so what it "
            "carries from one step to the next never builds up."
        )
        momentum = m.get("momentum", math.nan)
        if math.isfinite(momentum) and 0 < momentum < 1:
            what += (
                f" Its momentum buffer starts as each step's own gradient: every step is plain SGD's, about "
                f"{num(1 / (1 - momentum))}x smaller than the momentum {num(momentum)} the settings describe, and "
                "the loss falls that much more slowly."
            )
        elif m.get("moments"):
            what += (
                " Its moment estimates start over too: every step is its first, moving each parameter by about the "
                "learning rate in the sign of its gradient, whatever its gradient's history."
            )
        fix = (
            "make the optimizer once, before the training loop (and its learning-rate scheduler with it), and step "
            "that one; make a new one only where the run means to start over (a new phase), not for every batch."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        m = event.metrics
        return (
            f"the optimizer started over on {count(m.get('reset', 0.0))} of "
            f"{count(m.get('optimizer_steps', 0.0))} steps"
        )

    def place(self, event: SemanticEvent) -> str:
        return "the optimizer"
