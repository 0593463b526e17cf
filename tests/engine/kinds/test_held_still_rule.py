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


def test_a_run_too_small_to_train_is_worded_from_its_own_loss_and_updates() -> None:
    """A regression's chance level is its targets' (no log(classes) to quote), and updates that add up to exactly 0
    moved nothing (the steps were not too small: there were none)."""
    from neuraldbg.kinds.stalled_updates import SHAPES, _explain_run

    base = {"steps": 100.0, "start": 1.0, "end": 1.0, "shape": SHAPES["chance"], "lr": 1e-3}
    what, fix = _explain_run({**base, "run_updates": 0.0, "median_update_ratio": 0.0})
    assert "log(" not in what and "targets' mean" in what
    assert "No step moved the weights at all" in what and "raise the learning rate" not in fix
    what, fix = _explain_run({**base, "run_updates": 0.01, "classes": 4.0, "chance": 1.386})
    assert "log(4) = 1.39" in what and "too small" in what and "raise the learning rate" in fix
