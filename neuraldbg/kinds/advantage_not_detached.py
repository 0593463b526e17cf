"""Advantage not detached: a policy-gradient loss weighs each action's log-probability by an advantage (a return
minus a value estimate, ``R - value``) that still carries the value's gradient.

The policy gradient needs the advantage as a constant weight. Left in the graph, the policy term trains the value
head too: it pushes the value so as to make ``-log_prob * (R - value)`` smaller, whatever the return was, beside its
own regression onto the returns, and through a shared trunk that pull reaches the policy's features as well (plain
torch, pytorch/examples' actor-critic on a cart-pole: mean return 121 against 193 over seeds 0-2; a contextual
bandit's value head ends with a squared error 0.30 against 0.21). Nothing in the loss curve or the gradient sizes
shows it.

Read from the loss's autograd graph on the first backward passes that reach the model (see
:func:`~neuraldbg.capture.loss_graph.undetached_weight`): exact, with no statistics. A product of a log-probability
(a log_softmax; the log of a softmax's or sigmoid's output, as ``Categorical(probs).log_prob``; logits minus their
logsumexp, as ``Categorical(logits=...)``; a Normal's log-density; PPO's ratio ``exp(log_prob - old)``) and a
difference whose graph reaches parameters that the log-probability's does not. An entropy bonus (probabilities
times their own log) and a focal loss's weight (``(1 - p) ** gamma``, the same head's) reach the same parameters;
a return, a detached value or a baseline from a buffer carry no gradient. Rooted at the first layer holding those
parameters (the value head).
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from .base import Kind, RootLane, Series, layer_event

KIND = FailureKind.ADVANTAGE_NOT_DETACHED


class AdvantageNotDetached(Kind):
    name = KIND.value
    title = "advantage not detached"
    run_level = True  # about the program's loss (its event names the layer the policy term reaches)

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        if coverage.undetached is None:
            return None
        layers, step = coverage.undetached
        layer = layers[0] if layers else ""
        detail = ", ".join(f"'{name}'" for name in layers[:4]) + (" ..." if len(layers) > 4 else "")
        return layer_event(KIND, layer, step, coverage.last_step, {"layers": float(len(layers))}, detail)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a program's structure, exact from its first step: beside the other loss-graph findings
        return RootLane(3.5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the program computes its loss this way from the first step

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        held = root.detail or "parameters of another model (a critic the debugger does not watch)"
        what = (
            f"Advantage not detached: from step {root.step_start}, the loss multiplies log-probabilities of the "
            f"actions taken by a difference (an advantage, a return minus a value) whose gradient reaches {held}, "
            "which the log-probabilities do not use. The policy-gradient term then trains the value estimate too: it "
            "moves the value to make that product smaller instead of towards the return, and biases the policy's "
            "update through any layers the two heads share."
        )
        fix = (
            "detach the value in the advantage (advantage = R - value.detach(), or value.item() per step), and train "
            "the value with its own loss (F.smooth_l1_loss(value, R) or F.mse_loss)."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"a policy-gradient weight with a gradient into {event.detail or 'another model'}"

    def label(self, event: SemanticEvent) -> str:
        return "advantage not detached"

    def effect(self, event: SemanticEvent) -> str:
        return "value trained by the policy term"
