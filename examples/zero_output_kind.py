"""A failure kind added by a plugin: a layer whose output is exactly zero on the whole batch.

``nn.Dropout(p=1.0)`` left in by mistake, a mask that masks everything, a weight multiplied by 0: the layers after
it learn nothing from the input, and no gradient flows back through it. One file holds the whole kind (what finds
it, where it stands among root causes, what it causes, its words); registering the module makes NeuralDBG check it.
"""

from __future__ import annotations

from neuraldbg import hookimpl
from neuraldbg.detectors import Detector, Finding, Observation, StepView
from neuraldbg.events import EventType, SemanticEvent
from neuraldbg.health import GradientHealth, HealthState
from neuraldbg.kinds import Kind, RootLane, Series
from neuraldbg.reasoning import CausalRule, Topology


class Output(HealthState):
    """The state this kind adds to a layer's output."""

    ZERO = "zero"


class ZeroOutputDetector(Detector):
    """Finds layers whose output norm is exactly zero (read on fully observed steps)."""

    name = "zero_output"
    event_type = EventType.ACTIVATION

    def observe(self, view: StepView) -> Observation:
        obs = Observation()
        for (layer, call), norm in view.data.act.items():
            if not layer:
                continue  # the model as a whole
            obs.saw(self.event_type, layer, call=call)
            if norm == 0.0:
                finding = Finding(
                    self.event_type, ZERO_OUTPUT.kind, layer, Output.ZERO, {"output_norm": 0.0}, 1.0, call=call
                )
                obs.findings.append(finding)
        return obs


class ZeroOutput(Kind):
    name = "zero_output"
    title = "zero outputs"
    states = (Output.ZERO,)

    def detectors(self, config: object) -> list[Detector]:
        return [ZeroOutputDetector()]

    def lane(self, event: SemanticEvent) -> RootLane:
        return RootLane(3.5)  # a root before the vanishing gradients it causes (they stand at rank 6)

    def rules(self) -> list[CausalRule]:
        zeroes = "zeroes the gradient of"
        return [CausalRule("zero-output-zeroes-gradients", zeroes, self.kind, (GradientHealth.VANISHING,), "any")]

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        what = (
            f"{topo.describe(root.layer)} outputs exactly zero on every sample from step {root.step_start}: the "
            "layers after it learn nothing from the input, and no gradient flows back through it."
        )
        fix = f"find what zeroes the output of '{root.layer}' (a Dropout with p=1, a mask that masks everything)."
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return "output exactly zero on every sample"


ZERO_OUTPUT = ZeroOutput()


@hookimpl
def neuraldbg_kinds() -> list[Kind]:
    return [ZERO_OUTPUT]
