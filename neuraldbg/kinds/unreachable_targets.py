"""Unreachable targets: a loss by value (``mse_loss``, ``smooth_l1_loss``, ``huber_loss``) compares targets with the
output of an activation whose range does not hold them: a ReLU or softplus before standardised targets (half of them
negative), a sigmoid before targets outside [0, 1], a tanh before targets outside [-1, 1]. The targets out of range
can never be reached: the loss cannot fall below their squared distance to the range, and the units pushed against
a ReLU's floor get no gradient at all.

Read from the loss's autograd graph and one profile of the target on the first backward passes that reach the model
(see :mod:`neuraldbg.capture.loss_graph`): the loss node's prediction came from such an activation (looking through
views), and the target it saved, read on the device before the backward pass frees it, has at least :data:`SHARE`
of its elements out of the activation's range, whose squared distance to the range (the least mean squared error
the output can reach) is at least :data:`FLOOR` of the target's variance. Targets on the range's bounds (0/1
labels under a sigmoid) are within reach. A loss between two bounded outputs (a student's and a teacher's features)
never has its targets out of range.
"""

from __future__ import annotations

import math

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import num
from .base import Kind, RootLane, Series, layer_event

KIND = FailureKind.UNREACHABLE_TARGETS

#: The share of target elements out of the output's range, at least: a handful of outliers is no design fault.
SHARE = 0.05
#: The least mean squared error the range allows, at least this share of the target's variance: what the model
#: cannot learn is a real part of what there is to learn.
FLOOR = 0.05


class UnreachableTargets(Kind):
    name = KIND.value
    title = "targets out of the output's range"
    run_level = True  # about the program's loss (its event names the layer whose output is bounded)

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        bounded, profile = coverage.bounded_output, coverage.target_range
        if bounded is None or len(profile) != 3:
            return None
        share, floor, variance = profile
        if not (share >= SHARE and floor >= FLOOR * variance and floor > 0):
            return None
        activation, low, high, layer = bounded
        step = coverage.target_range_step
        metrics = {"share": share, "floor": floor, "variance": variance, "low": low, "high": high}
        return layer_event(KIND, layer, step, coverage.last_step, metrics, activation)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a program's structure, exact from its first step: beside the activation before a loss
        return RootLane(3.5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the program computes its loss this way from the first step

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        activation = root.detail or "an activation"
        where = f"the output of '{root.layer}'" if root.layer else "the model's output"
        what = (
            f"Targets out of the output's range: from step {root.step_start}, {where} passes through a "
            f"{activation}, whose values lie in {_range(m)}, before a loss by value, and "
            f"{num(100 * m.get('share', 0.0))}% of the targets lie outside that range. Those cannot be reached: the "
            f"mean squared error cannot fall below {num(m.get('floor', 0.0))} "
            f"({num(100 * m.get('floor', 0.0) / max(m.get('variance', 0.0), 1e-12))}% of the targets' variance)"
        )
        what += (
            ", and the units pushed below the ReLU's floor get no gradient at all."
            if activation == "ReLU"
            else ", and the gradient of those outputs shrinks as they approach the bound."
        )
        fix = (
            f"remove the {activation} from the model's output (a linear output reaches every target), or bring the "
            f"targets into its range ({_range(root.metrics)}) and back when reading predictions."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        share = num(100 * event.metrics.get("share", 0.0))
        return f"{share}% of the targets out of the {event.detail or 'output'}'s range {_range(event.metrics)}"

    def label(self, event: SemanticEvent) -> str:
        return f"targets out of the {event.detail or 'output'}'s range"

    def effect(self, event: SemanticEvent) -> str:
        return "targets out of reach"


def _range(metrics: dict[str, float]) -> str:
    low, high = metrics.get("low", 0.0), metrics.get("high", math.inf)
    return f"[{num(low)}, inf)" if math.isinf(high) else f"[{num(low)}, {num(high)}]"
