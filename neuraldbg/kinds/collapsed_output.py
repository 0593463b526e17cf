"""A layer with parameters whose output collapsed to nothing: over the last quarter of the run its
root-mean-square is at most :data:`COLLAPSE` of what it was on the first fully observed step (before any update).
The first such layer in forward order is the root (the layers after a collapsed one may collapse because their
input did). Judged on the layer output norms the fully observed steps already read (see
:class:`~neuraldbg.stats.outputs.OutputScales`); the model's last layer (its output's scale is the target's) is not
judged.

A layer whose output is about 0 whatever its input passes nothing on: the layers after it see a constant. Training
drives an output there when something in the loss pays for it: a penalty on that output that outweighs the
loss's other terms (a VAE's KL divergence, summed, beside a reconstruction loss averaged over pixels: the encoder's
mean and log-variance go to 0, the prior's values, and the latent carries nothing about the input: posterior
collapse), weight decay far too strong, or steps so large they threw the weights away. Healthy layers keep or grow
their scale as they learn (the real-programs benchmark's 21 healthy programs and 10 harmless mutants: no layer
below 0.58 of its starting scale).

Not judged: a run with fewer than :data:`MIN_READINGS` readings of a layer; a layer whose output was 0 from the
start; a layer without parameters (an activation whose units died: the dead units' room says so); a run whose start
was blown up and came back (:data:`BLOWN_UP`): its first step is no healthy level to fall from. An unnormalised
residual MLP of 12 blocks under kaiming init starts with its output 2e4 times its stem's (a first loss of 6,000 to
26,000); clipped steps shrink every branch until the output is back at a classifier's scale, and its first block's
output ends at 0.05 of its first step's while the run learns (held-out accuracy 0.75-0.89 against chance 0.26): the
return from an explosion (the exploding gradients' room), not a collapse.
"""

from __future__ import annotations

import math
import statistics

from ..capture import branches
from ..capture.coverage import Coverage, RunFacts
from ..events import EventType, FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..stats.outputs import OutputScales
from ..text import num
from .base import LAST_RANK, Kind, RootLane, Series, layer_event

KIND = FailureKind.COLLAPSED_OUTPUT

#: A layer's output scale over the last quarter of the run against its scale at the first step, at most (the
#: real-programs benchmark: healthy programs and harmless mutants 0.58 or more; a VAE whose KL term dominates
#: 0.04, weight decay 1 0.03).
COLLAPSE = 0.1
#: A collapse is measured, not guessed, but it is a symptom many faults leave: a layer's own fault (vanishing
#: gradients, dead units), which is more specific, ranks first when both are found.
CONFIDENCE = 0.5
#: Readings of a layer's output, at least.
MIN_READINGS = 8
#: Readings the final scale is the median of, at least (the last quarter's, or the last ones).
LAST_READINGS = 3
#: The model's output on its first step against its first layer's then and against its own at the end, at least,
#: for a start blown up through the layers that the run came back from (an unnormalised residual MLP of 12 blocks
#: under kaiming init: its output 2e4 times its stem's, 1e4 times its own at the end; default init: about 1).
BLOWN_UP = 100.0


def _blown_up_start(scales: OutputScales) -> bool:
    """Whether the model's output on its first fully observed step was an explosion's that the run came back from:
    at least :data:`BLOWN_UP` times the first layer's output then (the scale compounded through the layers) and
    at least :data:`BLOWN_UP` times its own at the end of the run."""
    if len(scales.order) < 2:
        return False
    first, last = scales.order[0], scales.order[-1]
    points = scales.series[last].points()
    end = statistics.median(v for _, v in points[-LAST_READINGS:]) if points else math.inf
    start = scales.start[last]
    return scales.start[first] > 0 and start >= BLOWN_UP * scales.start[first] and start >= BLOWN_UP * end


def collapsed(coverage: Coverage) -> list[tuple[str, float, float, int]]:
    """The layers whose output collapsed, in forward order, each with its starting and final scale and the first
    step it was at most :data:`COLLAPSE` of its start; the model's last layer is left out. Nothing when the start
    was an explosion's (:func:`_blown_up_start`): no healthy level to fall from."""
    scales = coverage.outputs
    found: list[tuple[str, float, float, int]] = []
    if _blown_up_start(scales):
        return found
    ends: dict[str, float] = {}  # each judged layer's final scale
    for layer in scales.order[:-1]:
        points = scales.series[layer].points()
        start = scales.start[layer]
        if len(points) < MIN_READINGS:
            continue
        begin, end = points[0][0], points[-1][0]
        tail = [v for s, v in points if s >= end - (end - begin) / 4]
        if len(tail) < LAST_READINGS:  # full steps grow sparse late in a run: its last readings stand in
            tail = [v for _, v in points[-LAST_READINGS:]]
        if not (math.isfinite(start) and start > 0):
            continue
        ends[layer] = final = statistics.median(tail)
        if final <= COLLAPSE * start:
            onset = next(s for s, v in points if v <= COLLAPSE * start)
            found.append((layer, start, final, onset))
    return [f for f in found if not _routed_around(f[0], scales, ends, coverage.parallel)]


def _routed_around(layer: str, scales: OutputScales, ends: dict[str, float], parallel: dict[str, str]) -> bool:
    """Whether ``layer`` is in a parallel copy of a block (capture/branches.py) while its counterpart in another copy
    kept its scale: the model stopped using this copy (a router that no longer chooses an expert, whose weights
    weight decay then shrinks; a mixture of 16 experts whose router settles on 4 leaves 12 so), which the faults that
    collapse an output (a penalty, weight decay far too strong, steps too large) would not spare the others of."""
    judged = [other for other in branches.siblings(layer, parallel) if other in ends]
    return any(ends[other] > COLLAPSE * scales.start[other] for other in judged)


class CollapsedOutput(Kind):
    name = KIND.value
    title = "collapsed layer output"
    run_level = True  # judged over the whole run (its event still names the layer)

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        found = collapsed(coverage)
        if not found:
            return None
        layer, start, final, onset = found[0]
        others = [name for name, *_ in found[1:]]
        metrics = {"start": start, "end": final, "ratio": final / start, "limit": COLLAPSE}
        detail = ", ".join(others)
        return layer_event(
            KIND,
            layer,
            onset,
            coverage.last_step,
            metrics,
            detail,
            event_type=EventType.ACTIVATION,
            confidence=CONFIDENCE,
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # after every fault of a layer and after the loss findings: a symptom that many faults leave (weight decay
        # far too strong shows first in its loss)
        return RootLane(LAST_RANK + 0.5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        also = f"; {', '.join(repr(n) for n in root.detail.split(', '))} collapsed after it" if root.detail else ""
        what = (
            f"The output of '{root.layer}' collapsed: its root-mean-square fell from {num(m.get('start', 0.0))} on "
            f"the first steps to {num(m.get('end', 0.0))} over the last quarter of the run "
            f"({num(m.get('ratio', 0.0))} of it, from step {root.step_start}), while no layer before it "
            f"collapsed{also}. An output near 0 whatever the input passes nothing on: the layers after it see a "
            "constant. Something in the loss pays for it: a penalty on this output that outweighs the other terms "
            "(a VAE's KL divergence, summed, beside a reconstruction loss averaged over pixels: posterior "
            "collapse, the latent carries nothing about the input), weight decay far too strong, or steps so large "
            "they threw the weights away."
        )
        fix = (
            "weigh the loss's terms as intended: sum the reconstruction loss over pixels as the KL term is summed "
            "(or weight, anneal or floor the KL term); lower the weight decay or the learning rate if either is "
            "far above the usual."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"output collapsed to {num(event.metrics.get('ratio', 0.0))} of its scale"

    def label(self, event: SemanticEvent) -> str:
        return f"output collapsed ({num(event.metrics.get('ratio', 0.0))}x)"

    def effect(self, event: SemanticEvent) -> str:
        return "a layer output collapsed to nothing"
