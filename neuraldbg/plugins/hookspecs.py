"""Extension points: add a failure kind, a detector or a causal rule without forking NeuralDBG.

Implement one or more hooks in a plain module or object and register it, per debugger
(``NeuralDbg(model, plugins=[my_plugin])``), for the whole process (``neuraldbg.register_plugin(my_plugin)``), or
for every installation through an entry point in the ``neuraldbg`` group::

    [project.entry-points.neuraldbg]
    my_checks = "my_package.neuraldbg_checks"

A kind (:func:`neuraldbg_kinds`) is the whole of a new failure: its findings become hypotheses like a built-in
kind's (they fail ``assert_healthy``, the gate and ``assert not ndbg.explain_failure()``, and appear in every report
and trace). A detector or a rule alone (:func:`neuraldbg_detectors`, :func:`neuraldbg_causal_rules`) adds evidence
to the kinds that exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from ..config import DebugConfig
    from ..detectors.base import Detector
    from ..kinds.base import Kind
    from ..reasoning.rules import CausalRule

hookspec = pluggy.HookspecMarker("neuraldbg")
hookimpl = pluggy.HookimplMarker("neuraldbg")


@hookspec
def neuraldbg_kinds() -> list[Kind]:
    """Return the failure kinds this plugin adds, one :class:`~neuraldbg.kinds.Kind` instance each.

    A kind names itself, brings the detectors that find it, and says in words what happened and what to change;
    everything else (persistence, events, root causes, ranking, reports, traces) is done for it. Example, a layer
    whose output is constant (all zeros)::

        from neuraldbg import hookimpl
        from neuraldbg.detectors import Detector, Finding, Observation
        from neuraldbg.events import EventType
        from neuraldbg.health import HealthState
        from neuraldbg.kinds import Check, Kind

        class Output(HealthState):
            CONSTANT = "constant"

        class ConstantDetector(Detector):
            name = "constant_output"
            event_type = EventType.ACTIVATION

            def observe(self, view):
                obs = Observation()
                for (layer, call), norm in view.data.act.items():
                    obs.saw(self.event_type, layer, call=call)
                    if norm == 0.0:
                        obs.findings.append(Finding(self.event_type, CONSTANT.kind, layer, Output.CONSTANT,
                                                    {"output_norm": norm}, strength=1.0, call=call))
                return obs

        class ConstantOutput(Kind):
            name = "constant_output"
            states = (Output.CONSTANT,)

            def detectors(self, config):
                return [ConstantDetector()]

            def explain(self, root, rest, topo, series):
                return (f"{topo.describe(root.layer)} outputs only zeros from step {root.step_start}.",
                        "check what feeds it.")

        CONSTANT = ConstantOutput()

        @hookimpl
        def neuraldbg_kinds():
            return [CONSTANT]
    """


@hookspec
def neuraldbg_detectors(config: DebugConfig) -> list[Detector]:
    """Return fresh detector instances to run on every observed step of a new debugger.

    A detector reads one step's statistics and returns findings; persistence, merging into events and the causal
    reasoning are done for it. A finding of a kind (built-in, or a plugin's) counts as that kind; a kind-less
    finding (``kind=None``) is evidence that rules may attach to a failure, never a failure by itself. To add a
    failure, add a kind (:func:`neuraldbg_kinds`).
    """


@hookspec
def neuraldbg_causal_rules() -> list[CausalRule]:
    """Return causal rules to add to the kinds' own.

    A rule says which event can explain which; :class:`~neuraldbg.reasoning.CausalRule` covers the common shape
    (a cause kind, effect kinds or states, a direction in forward order). Example: saturation also explains dead
    units downstream::

        from neuraldbg import FailureKind, hookimpl
        from neuraldbg.health import ActivationHealth
        from neuraldbg.reasoning import CausalRule

        @hookimpl
        def neuraldbg_causal_rules():
            return [CausalRule("saturation-kills-downstream", "starves", FailureKind.SATURATED_ACTIVATIONS,
                               (ActivationHealth.DEAD,), "downstream")]
    """
