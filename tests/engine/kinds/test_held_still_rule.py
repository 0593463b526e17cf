"""The rule that joins the layers one clipping holds still into one hypothesis joins those layers' events only: the
run-level finding of a run too small to train carries the run's clip factor too, and is not one of them."""

from __future__ import annotations

from neuraldbg.events import EventType, FailureKind, SemanticEvent
from neuraldbg.health import UpdateHealth
from neuraldbg.kinds.stalled_updates import StalledUpdates
from neuraldbg.reasoning.topology import Topology

KIND = FailureKind.STALLED_UPDATES


def stall(layer: str, **metrics: float) -> SemanticEvent:
    return SemanticEvent(EventType.UPDATE, KIND, layer, None, 0, 99, None, UpdateHealth.STALLED, metrics, 0.9)


def test_layers_held_still_by_clipping_join_and_the_run_level_finding_does_not():
    (rule,) = StalledUpdates().rules()
    topo = Topology(order=["enc.0", "enc.2", "dec.0"], types={}, roles={}, last_step=99)
    first, second = stall("enc.0", clip=5e3, median_update_ratio=1e-7), stall("enc.2", clip=5e3)
    run = stall("", clip=5e3, run_updates=0.01)
    assert rule.applies_to(first) and rule.explains(first, second, topo)
    assert not rule.applies_to(run) and not rule.explains(run, first, topo) and not rule.explains(first, run, topo)
    assert not rule.explains(first, stall("dec.0", median_update_ratio=1e-7), topo)  # a stall without clipping
