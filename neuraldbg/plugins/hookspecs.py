"""Extension points: add a detector or a causal rule without forking NeuralDBG.

Implement one or both hooks in a plain module or object and register it, per debugger
(``NeuralDbg(model, plugins=[my_plugin])``), for the whole process (``neuraldbg.register_plugin(my_plugin)``), or
for every installation through an entry point in the ``neuraldbg`` group::

    [project.entry-points.neuraldbg]
    my_checks = "my_package.neuraldbg_checks"
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from ..config import DebugConfig
    from ..detectors.base import Detector
    from ..reasoning.rules import CausalRule

hookspec = pluggy.HookspecMarker("neuraldbg")
hookimpl = pluggy.HookimplMarker("neuraldbg")


@hookspec
def neuraldbg_detectors(config: DebugConfig) -> list[Detector]:
    """Return fresh detector instances to run on every observed step of a new debugger.

    A detector reads one step's statistics and returns findings; persistence, merging into events and the
    causal reasoning are done for it. Example, flagging layers whose outputs are all identical (a constant
    layer)::

        import math
        from neuraldbg import hookimpl
        from neuraldbg.detectors import Detector, Finding, Observation
        from neuraldbg.events import EventType

        class ConstantOutput(Detector):
            name = "constant_output"
            event_type = EventType.ACTIVATION

            def observe(self, view):
                obs = Observation()
                for (layer, call), norm in view.data.act.items():
                    obs.saw(self.event_type, layer, call=call)
                    if norm == 0.0:
                        obs.findings.append(Finding(self.event_type, None, layer, "constant",
                                                    {"output_norm": norm}, strength=1.0, call=call))
                return obs

        @hookimpl
        def neuraldbg_detectors(config):
            return [ConstantOutput()]
    """


@hookspec
def neuraldbg_causal_rules() -> list[CausalRule]:
    """Return causal rules to add to the built-in ones.

    A rule says which event can explain which; :class:`~neuraldbg.reasoning.CausalRule` covers the common shape
    (a cause kind, effect kinds, a direction in forward order). Example: saturation also explains dead units
    downstream::

        from neuraldbg import FailureKind, hookimpl
        from neuraldbg.reasoning import CausalRule

        @hookimpl
        def neuraldbg_causal_rules():
            return [CausalRule("saturation-kills-downstream", "starves", FailureKind.SATURATED_ACTIVATIONS,
                               (FailureKind.DEAD_NEURONS,), "downstream")]
    """
