"""An unstable loss: it climbs over the run, or it stopped falling while each update changes the weights by a
large fraction of their norm (``loss_large_update``, or weights whose norm grew threefold): the learning rate is
too high for the loss to settle, though not high enough for the gradients to explode.

A climb is judged against the loss's own noise (its end above its start by more than its batch-to-batch spread);
a stop is a second half that fell by less than that spread. See :mod:`.loss_evidence` for the runs it is judged
on. A fault that began first (gradients not zeroed, an explosion) explains it.
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, num
from . import loss_evidence
from .base import LAST_RANK, Kind, RootLane, Series, run_event

KIND = FailureKind.UNSTABLE_LOSS


class UnstableLoss(Kind):
    name = KIND.value
    title = "unstable loss"
    run_level = True
    loss_symptom = True
    lr_sensitive = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        found = loss_evidence.finding(coverage, facts.config)
        if found is None or found[0] != self.name:
            return None
        curve = found[1]
        metrics = loss_evidence.evidence(coverage, facts.config, curve)
        metrics["climbing"] = float(curve.verdict == "climbing")
        return run_event(KIND, curve.start.first, curve.end.last, curve.large_updates, **metrics)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(LAST_RANK, order=2)

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        start, end, noise = m.get("start", 0.0), m.get("end", 0.0), m.get("noise", 0.0)
        steps = count(m.get("losses", 0.0))
        if m.get("climbing"):
            what = (
                f"The loss climbed: over {steps} steps it went from {num(start)} (its first steps) to {num(end)} "
                f"(steps {int(m.get('end_from', root.step_end))}-{root.step_end}), up by more than its batch-to-batch "
                f"spread ({num(noise)}), while the gradients stayed finite."
            )
        else:
            what = (
                f"The loss stopped falling at {num(end)}: over the second half of the run it went from "
                f"{num(m.get('half_from', end))} to {num(m.get('half_to', end))}, less than its batch-to-batch spread "
                f"({num(noise)}), while {root.detail or 'the updates were large'}: the steps are too large for the "
                "loss to settle into a minimum."
            )
        causes, fix = loss_evidence.ranked(m, "unstable")
        return what + causes, fix

    def describe(self, event: SemanticEvent) -> str:
        m = event.metrics
        how = "climbing" if m.get("climbing") else "stopped falling"
        return f"unstable loss ({how}: {num(m.get('start', 0.0))} to {num(m.get('end', 0.0))})"

    def label(self, event: SemanticEvent) -> str:
        return f"unstable loss: {num(event.metrics.get('end', 0.0))}"

    def effect(self, event: SemanticEvent) -> str:
        return "an unstable loss"

    def place(self, event: SemanticEvent) -> str:
        return "the loss"
