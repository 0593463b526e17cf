"""A loss-scale collapse: a GradScaler skipping most steps, or backed off below a scale of 1.

A skipped step is the scaler doing its job (the scaled gradients overflowed float16, the step is dropped and the
scale lowered), not a failure; a scale that keeps collapsing is: a run that cannot learn whatever its layers do.
Found when most of the last :data:`~neuraldbg.capture.coverage.SCALE_WINDOW` steps were skipped (or all of a
shorter run's, at least 3), when that many steps in a row were skipped after training had begun, or when the scale
backed off below :data:`~neuraldbg.capture.coverage.SCALE_FLOOR` (the gradients overflow even unscaled)."""

from __future__ import annotations

import math

from ..capture.coverage import SCALE_FLOOR, SCALE_WINDOW, Coverage, RunFacts, ScalerCounts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, num
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.LOSS_SCALE_COLLAPSE


def _collapse(counts: ScalerCounts, last: int) -> SemanticEvent | None:
    window = list(counts.recent)
    skipped_recent = [step for step, skipped in window if skipped]
    spans: list[tuple[int, int]] = []
    parts: list[str] = []
    if len(skipped_recent) >= max(3, (len(window) + 1) // 2):
        # from where the skipping began: the window's first skip, or the start of a streak reaching into it
        begun = min(skipped_recent[0], counts.streak_start) if counts.streak else skipped_recent[0]
        spans.append((begun, last))
        parts.append(f"{len(skipped_recent)} of the last {len(window)} steps skipped")
    longest = counts.collapse
    if counts.streak >= SCALE_WINDOW and counts.streak_in_training and (longest is None or counts.streak > longest[2]):
        longest = (counts.streak_start, counts.streak_end, counts.streak)
    if longest is not None:
        spans.append((longest[0], longest[1]))
        parts.append(f"{longest[2]} steps in a row skipped (steps {longest[0]}-{longest[1]}) after training began")
    if counts.below_floor is not None:
        spans.append(counts.below_floor)
        parts.append(f"the scale backed off below {SCALE_FLOOR:g}")
    if not spans:
        return None
    metrics: dict[str, float] = {
        "skipped_steps": float(counts.skipped),
        "steps": float(counts.steps),
        "window_steps": float(len(window)),
        "skipped_in_window": float(len(skipped_recent)),
    }
    for key, value in (
        ("first_scale", counts.first_scale),
        ("loss_scale", counts.last_scale),
        ("min_scale", counts.min_scale),
    ):
        if value is not None:
            metrics[key] = value[1]
    start = min(s for s, _ in spans)
    end = max(e for _, e in spans)
    return run_event(KIND, start, end, "; ".join(parts), **metrics)


class LossScaleCollapse(Kind):
    name = KIND.value
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        if coverage.scaler is None:
            return None
        return _collapse(coverage.scaler, max(coverage.last_step, 0))

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(0, order=9)

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        skipped, steps = m.get("skipped_steps", 0.0), m.get("steps", 0.0)
        scales = ""
        if "first_scale" in m and "loss_scale" in m:
            scales = f"; its scale went from {num(m['first_scale'])} to {num(m['loss_scale'])}"
        what = (
            f"Loss-scale collapse: the GradScaler skipped {count(skipped)} of {count(steps)} observed steps "
            f"({root.detail or 'most of the last steps skipped'}){scales}. A skipped step leaves the weights "
            "unchanged: the scaled gradients overflowed float16 (or were NaN), so this run hardly trains."
        )
        if m.get("min_scale", math.inf) < 1:
            fix = (
                "the scale fell below 1, so the gradients overflow (or are NaN) even unscaled: find the layer with "
                "torch.autograd.detect_anomaly() on one batch, lower the learning rate, or train in bfloat16 (which "
                "needs no GradScaler)."
            )
        else:
            fix = (
                "start from a smaller init_scale (the default is 2**16) or give the scaler more steps to find its "
                "scale; if it keeps skipping, some gradient is inf or NaN at any scale: find it with "
                "torch.autograd.detect_anomaly() on one batch, or train in bfloat16."
            )
        return what, fix
