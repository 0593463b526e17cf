"""Non-finite values (inf, NaN) in the input batch, in a layer's output, in the loss or in a parameter gradient.

Checked on every step (the outputs, the input, the loss and the gradient it sends back, and whether any parameter
gradient the optimizer receives holds an inf or a NaN) and on every fully observed step (each layer's parameter
gradients in full), and decisive: one occurrence is an event, dated at its step. NaN compares false with
everything, so a ``norm < threshold`` test would pass it silently; these detectors look for it explicitly.

A non-finite value in the input batch, a layer's output or the model's output that neither the loss nor any
gradient of the step holds is not a failure: the model's own code dealt with it (missing values imputed inside
``forward``, a mask of ``-inf`` added to the logits of moves that are not allowed, whose softmax gives them 0, the
NaN a softmax module gives a fully masked row, zeroed after it). A non-finite value that reaches the training shows
in the loss or a gradient of its step, and is found where it was made.

Where it appears first is where it was made: non-finite values in the input batch are a data problem at that step;
in the forward pass, the first layer in forward order that produced them; a loss that is non-finite while the
model's outputs are finite, the loss computation; gradients non-finite while the forward pass was finite, the last
layer in forward order whose gradient is (the backward pass runs from the last layer to the first). A non-finite
input is a root of its own before any layer failure; elsewhere the earliest acute failure (this or an explosion)
is the root. Once values are non-finite, later non-finite values, and the layer failures they corrupt, follow
from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import DebugConfig
from ..detectors.base import Detector, Finding, Observation, StepView
from ..events import EventType, FailureKind, SemanticEvent
from ..health import ActivationHealth, GradientHealth
from ..reasoning.rules import CausalRule
from ..reasoning.topology import Topology
from ..stats.step import StepData
from ..text import num
from . import loss_evidence
from .base import Check, Kind, RootLane, Series

KIND = FailureKind.NON_FINITE

_STATE = ActivationHealth.NON_FINITE  # the input batch and the loss are read like an output


class NonFiniteDetector(Detector):
    """Non-finite values in the input batch, any layer's output or the loss (every step)."""

    name = "non_finite"
    event_type = EventType.ACTIVATION

    def quiet_on(self, data: StepData) -> bool:
        """Nothing non-finite anywhere in this step's readings (the common case, checked cheaply)."""
        values = (data.input_norm, data.output_norm, data.target_grad, data.head_grad, data.loss, *data.act.values())
        return data.head_finite is not False and all(v is None or math.isfinite(v) for v in values)

    def observe(self, view: StepView) -> Observation | None:
        data = view.data
        obs = Observation()
        inside = False
        layers: list[Finding] = []
        for key, norm in data.act.items():
            obs.saw(self.event_type, key[0], call=key[1])
            if not math.isfinite(norm):
                inside = True
                layers.append(_finding(EventType.ACTIVATION, key[0], {"output_norm": norm}, call=key[1]))
        # a non-finite value in the input, a layer's output or the model's output that neither the loss nor any
        # gradient of the step holds never reached the training: the model's own code dealt with it (missing values
        # imputed in forward, a mask of -inf added to the logits of moves that are not allowed, the NaN rows a
        # softmax module gives fully masked rows, zeroed by nan_to_num after it)
        contained = _signal_finite(data)
        if contained:
            layers = []
        if data.input_norm is not None:
            obs.saw(EventType.INPUT, "")
            if not math.isfinite(data.input_norm) and not contained:
                obs.findings.append(_finding(EventType.INPUT, "", {"input_norm": data.input_norm}))
        obs.findings.extend(layers)
        if data.output_norm is not None:
            obs.saw(self.event_type, "")
            if not inside and not math.isfinite(data.output_norm) and not contained:  # the model's own forward code
                obs.findings.append(_finding(EventType.ACTIVATION, "", {"output_norm": data.output_norm}))
        # the loss, then the gradient it sends back (a finite loss may send back a NaN: sqrt(0)): non-finite while
        # the output is finite means the loss computation made it (a NaN in the forward pass shows in the outputs
        # first)
        head = None if data.head_finite is None else (0.0 if data.head_finite else math.nan)
        for metric, value in (
            ("loss", data.loss),
            ("loss_gradient_norm", data.target_grad),
            ("head_gradient_norm", data.head_grad),
            ("head_gradient_finite", head),
        ):
            if value is not None:
                obs.saw(EventType.LOSS, "")
                output_ok = data.output_norm is None or math.isfinite(data.output_norm)
                if not math.isfinite(value) and output_ok and not inside:
                    metrics = {metric: 0.0} if metric == "head_gradient_finite" else {metric: value}
                    obs.findings.append(_finding(EventType.LOSS, "", metrics))
                    break
                if metric != "loss":  # a finite loss (recorded on every step) may still send back a NaN gradient
                    break
        return obs


class NonFiniteGradientDetector(Detector):
    """A layer's parameter gradient holding inf or NaN elements: a state of its gradient. Fully observed steps
    read every gradient; cheap steps file only the gradients whose norm is not finite."""

    name = "non_finite_gradient"
    track = "gradient"
    event_type = EventType.GRADIENT

    def quiet_on(self, data: StepData) -> bool:
        return not data.grad_nonfinite

    def observe(self, view: StepView) -> Observation | None:
        grads = view.layer_gradients
        if not grads:
            return None
        top = max((g.norm for g in grads.values() if math.isfinite(g.norm)), default=0.0)
        obs = Observation()
        obs.saw_each(self.event_type, grads)
        for layer, g in grads.items():
            if g.non_finite:
                metrics = {"grad_norm": g.norm, "max_layer_grad_norm": top}
                finding = Finding(self.event_type, KIND, layer, GradientHealth.NON_FINITE, metrics, 1.0, decisive=True)
                obs.findings.append(finding)
        return obs


def _signal_finite(data: StepData) -> bool:
    """Whether the step's training signal was read and finite: its loss, the gradient the loss sends back, and
    every parameter gradient the optimizer received (a step whose loss was not read is not known to be)."""
    if data.loss is None or not math.isfinite(data.loss) or data.grad_nonfinite or data.head_finite is False:
        return False
    return all(v is None or math.isfinite(v) for v in (data.target_grad, data.head_grad))


def _finding(event_type: EventType, layer: str, metrics: dict[str, float], call: int = 0) -> Finding:
    return Finding(event_type, KIND, layer, _STATE, metrics, 1.0, call=call, decisive=True)


#: Order of events within one step: the forward pass runs input -> layers -> loss, the backward pass after it.
_STEP_ORDER = {EventType.INPUT: 0, EventType.ACTIVATION: 1, EventType.LOSS: 2, EventType.GRADIENT: 3}


@dataclass(frozen=True)
class NonFiniteAfterwards(CausalRule):
    """Once values are non-finite, later non-finite values (and failures they corrupt) follow from them."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        if cause.kind is not KIND or effect.kind not in self.effect_kinds:
            return False
        if effect.step_start > cause.step_start:
            return True
        if effect.step_start < cause.step_start:
            return False
        a, b = _STEP_ORDER.get(cause.event_type, 4), _STEP_ORDER.get(effect.event_type, 4)
        if a != b:
            return a < b
        if cause.event_type is EventType.GRADIENT:  # backward runs from the last layer to the first
            return topo.event_position(effect) < topo.event_position(cause)
        return topo.event_position(effect) > topo.event_position(cause)

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return cause.step_start

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        if a.step_start != b.step_start:
            return a.step_start < b.step_start
        ta, tb = _STEP_ORDER.get(a.event_type, 4), _STEP_ORDER.get(b.event_type, 4)
        if ta != tb:
            return ta < tb
        here, there = topo.event_position(a), topo.event_position(b)
        return here >= there if a.event_type is EventType.GRADIENT else here <= there


#: Where a non-finite value stands among root causes, by where it was seen: an input batch before any layer
#: failure; elsewhere with the acute failures, the forward pass first, then the loss, then the backward pass.
_LANES = {
    EventType.INPUT: RootLane(1),
    EventType.ACTIVATION: RootLane(2, order=1),
    EventType.LOSS: RootLane(2, order=2),
    EventType.GRADIENT: RootLane(2, order=3, last_first=True),
}


class NonFinite(Kind):
    name = KIND.value
    acute = True
    lr_sensitive = True
    confirms_escalation = True
    states = (ActivationHealth.NON_FINITE, GradientHealth.NON_FINITE)
    title = "non-finite values"
    check = Check("assert_finite", "non-finite values")

    def detectors(self, config: DebugConfig) -> list[Detector]:
        return [NonFiniteDetector(), NonFiniteGradientDetector()]

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return _LANES.get(event.event_type, RootLane(2, order=4))

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return not self.from_data(root.event_type)  # bad data is not the learning rate's doing

    def from_data(self, event_type: EventType) -> bool:
        return event_type is EventType.INPUT

    def rules(self) -> list[CausalRule]:
        corrupted = (
            ActivationHealth.NON_FINITE,
            GradientHealth.NON_FINITE,
            ActivationHealth.DEAD,
            ActivationHealth.SATURATED,
            GradientHealth.VANISHING,
            GradientHealth.EXPLODING,
        )
        return [NonFiniteAfterwards("non-finite-propagates", "propagates to", KIND, corrupted, same_place_joins=True)]

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        k = root.step_start
        spread = {e.layer for e in rest if e.kind is KIND and e.layer}
        if root.event_type is EventType.INPUT:
            what = (
                f"The input batch at step {k} contains non-finite values (inf or NaN)"
                + (f"; {len(spread)} layers turned non-finite at once" if spread else "")
                + ". This is a data problem, not a model problem."
            )
            fix = (
                f"check the input batch at step {k} (torch.isfinite(inputs).all()) and the data pipeline that "
                "produced it (division by zero, log of 0, missing values); filter or repair such batches."
            )
        elif root.event_type is EventType.LOSS:
            what = (
                f"The loss became non-finite at step {k} while the model's outputs were finite: the loss computation "
                "produced it."
            )
            fix = (
                "use a numerically stable loss on logits (CrossEntropyLoss, BCEWithLogitsLoss) instead of taking the "
                "log of probabilities, clamp probabilities away from 0 and 1, and check the targets."
            )
            raw = loss_evidence.raw_input_rms(series, topo.last_step)
            if raw is not None:  # a log-rate or a logit computed from raw values overflows an exp in the loss
                what += f" The input batch's root-mean-square is {num(raw)}: the data are far from unit scale."
                fix = (
                    f"normalise the inputs to about unit scale (their root-mean-square is {num(raw)}): outputs "
                    "computed from raw values overflow the exp inside a loss (a Poisson or a Gaussian likelihood's "
                    "rate, a logit); then, if it persists, " + fix
                )
        elif root.event_type is EventType.GRADIENT:
            what = (
                f"Non-finite gradients appear first in {topo.describe(root.layer)} at step {k}, in the backward "
                "pass, while the forward pass was finite: an operation there has an infinite derivative."
            )
            fix = (
                "add an epsilon inside sqrt, pow and norm, and to divisors; clamp inputs of log; avoid "
                "differentiating through points where the function is not differentiable."
            )
        else:
            what = (
                f"{topo.describe(root.layer)} produced non-finite values (inf or NaN) at step {k} while the input "
                "batch and the outputs of the layers before it were finite"
                + (f"; they spread to {len(spread)} later layers" if spread else "")
                + ", and they reached the loss or the gradients."
            )
            fix = (
                f"guard the computation in '{root.layer}': clamp before log, sqrt or pow, add an epsilon to "
                "divisions, and check its weights for inf; a softmax over scores masked with -inf gives NaN on a "
                "row masked everywhere (a sequence that is all padding): leave one position unmasked or zero those "
                "rows after it, before anything reaches the loss; if values grew before turning non-finite, lower "
                "the learning rate."
            )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return {
            EventType.INPUT: "non-finite values (inf or NaN) in the batch",
            EventType.LOSS: "non-finite loss (inf or NaN)",
            EventType.GRADIENT: "gradient non-finite (inf or NaN)",
        }.get(event.event_type, "outputs non-finite (inf or NaN)")

    def label(self, event: SemanticEvent) -> str:
        return {
            EventType.INPUT: "non-finite input batch",
            EventType.LOSS: "non-finite loss",
            EventType.GRADIENT: "non-finite gradient",
        }.get(event.event_type, "non-finite output")

    def effect(self, event: SemanticEvent) -> str:
        return {
            EventType.GRADIENT: "non-finite gradients",
            EventType.ACTIVATION: "non-finite outputs",
            EventType.LOSS: "a non-finite loss",
        }.get(event.event_type, f"{event.to_state} {event.event_type.value}")
