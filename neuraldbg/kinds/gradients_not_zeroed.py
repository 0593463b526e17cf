"""Gradients not zeroed: ``optimizer.zero_grad()`` missing, so every step's gradient adds to all the earlier ones.

Proved exactly, with no statistics (see :mod:`neuraldbg.capture.ledger`): at the start of a backward pass a
parameter's ``.grad`` was still the very tensor the optimizer had applied at its previous step, unmodified since
(same identity, same version counter, not all zeros), and no reset came before the optimizer stepped again. The
update then follows the sum of every gradient so far, not the current batch: it grows with the number of steps,
and the loss may do anything. Without an optimizer object (a manual update), the head parameter's ``.grad``
survived the update unchanged. Legitimate gradient accumulation (several backward passes, then the step, then
``zero_grad``) never matches: the gradients are reset after each step. The parameters carried over are named
beside any others that got fresh gradients in the same pass: two optimizers, one whose ``zero_grad`` was left out
(a body and a head trained apart). Reported once it held on two steps.
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..health import ActivationHealth, GradientHealth, UpdateHealth
from ..reasoning.rules import CausalRule
from ..reasoning.topology import Topology
from ..text import count, num, quoted
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.GRADIENTS_NOT_ZEROED

#: Steps with a proved carry-over before it is reported (one could be a loop's odd first iteration).
MIN_STEPS = 2


class GradientsNotZeroed(Kind):
    name = KIND.value
    title = "gradients not zeroed"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        if coverage.carried_steps < MIN_STEPS or coverage.carried_span is None:
            return None
        first, last = coverage.carried_span
        metrics = {"steps": float(coverage.carried_steps), "parameters": float(len(coverage.carried_params))}
        if coverage.carried_by:  # an optimizer applied the gradients (else a manual update did)
            metrics.update(stepped_steps=float(coverage.stepped_steps), optimizer=1.0)
        scaler = coverage.scaler
        if scaler is not None and scaler.min_scale is not None:  # a GradScaler unscaled the leftovers in place
            metrics.update(loss_scale=scaler.min_scale[1])
        return run_event(KIND, first, last, ", ".join(coverage.carried_params), **metrics)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(0, order=4)

    def rules(self) -> list[CausalRule]:
        grows = "makes the accumulated gradient grow into"
        return [
            CausalRule(
                "not-zeroed-grows-gradients",
                grows,
                KIND,
                (GradientHealth.EXPLODING, GradientHealth.NON_FINITE, ActivationHealth.NON_FINITE),
                same_place_joins=True,
            ),
            CausalRule(
                "not-zeroed-oversized-updates",
                "makes the updates grow into",
                KIND,
                (None,),
                effect_states=(UpdateHealth.EXPLODING,),
                same_place_joins=True,
            ),
            CausalRule(
                "not-zeroed-kills-units",
                "drives the accumulated updates into",
                KIND,
                (ActivationHealth.DEAD, ActivationHealth.SATURATED),
                same_place_joins=True,
            ),
        ]

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        names = [n for n in root.detail.split(", ") if n]
        params = quoted(names, 3) if names else "the parameters"
        steps = count(m.get("steps", 0.0))
        optimizer = m.get("optimizer") == 1.0
        if optimizer:
            of = f" of {count(m['stepped_steps'])}" if m.get("stepped_steps") else ""
            what = (
                f"Gradients are not zeroed between optimizer steps: on {steps}{of} steps, from step "
                f"{root.step_start}, the backward pass began while {params} still held the very gradient the "
                "optimizer had applied at the previous step, unmodified, and the optimizer then stepped with the new "
                "gradient added to it."
            )
            scale = m.get("loss_scale")
            if scale is not None and scale > 1:
                what += (
                    " Under the GradScaler the leftover had been unscaled in place (divided by the scale) before the "
                    "optimizer used it, and the next unscale divides it again: it adds about 1/scale of itself to the "
                    f"next gradient (the scale was {num(scale)} at its lowest), little while the scale stays large, "
                    "but the loop is wrong and the leftover weighs more as the scale falls."
                )
            else:
                what += (
                    " Each update follows the sum of every gradient so far instead of the current batch, so it grows "
                    "with the number of steps."
                )
            fix = (
                "call optimizer.zero_grad() once per iteration, before loss.backward() (or right after "
                "optimizer.step()); for gradient accumulation, zero after each optimizer.step(), not between the "
                "micro-batches."
            )
        else:
            what = (
                f"Gradients are not zeroed between updates: on {steps} steps, from step {root.step_start}, the "
                f"backward pass began while {params} still held the gradient of the previous step, which had already "
                "been used to change the parameters. Each update follows the sum of every gradient so far instead of "
                "the current batch."
            )
            fix = (
                "call model.zero_grad() (or set every p.grad = None) once per iteration, before loss.backward(); for "
                "gradient accumulation, zero after each update, not between the micro-batches."
            )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"gradients not zeroed between steps ({count(event.metrics.get('steps', 0.0))} steps)"

    def place(self, event: SemanticEvent) -> str:
        return "the run"
