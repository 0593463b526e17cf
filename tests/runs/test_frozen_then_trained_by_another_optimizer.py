"""Parameters that no stepping optimizer holds for a first phase, and that a second optimizer trains after it, are not
frozen parameters: linear probing then fine-tuning (LP-FT) written as an optimizer over the head for the probe and a
new one over every parameter after it, and block-coordinate training that steps the backbone's optimizer and the
head's in turn. Ground truth by plain torch: the parameters left out do not move during their phase and move after
it, and the model reaches a one-phase twin's held-out accuracy. LP-FT whose second phase was forgotten, and a layer
joined to the training only for the run's last quarter, are still frozen."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.capture.coverage import Coverage, RunFacts
from neuraldbg.events import EventType, SemanticEvent
from neuraldbg.health import UpdateHealth
from neuraldbg.kinds.frozen_parameters import FrozenParameters
from neuraldbg.stats.history import History

STEPS = 240
PHASE = 80
make = support.classification_batches((16,), 4, batch=64, seed=7)
HELD_OUT = make(10_000)

#: Which optimizer steps at a step: "backbone", "head" or "all".
Schedule = Callable[[int], str]


def lpft(step: int) -> str:
    return "head" if step < PHASE else "all"


def in_turn(step: int) -> str:
    return "backbone" if (step // PHASE) % 2 == 0 else "head"


def run(schedule: Schedule, watched: bool) -> tuple[float, list[bool], list[bool], NeuralDbg | None]:
    """Held-out accuracy, and whether the backbone's first weight and the head's weight moved at each step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizers = {
        "backbone": torch.optim.Adam(model[:4].parameters(), lr=3e-3),
        "head": torch.optim.Adam(model[4].parameters(), lr=3e-3),
        "all": torch.optim.Adam(model.parameters(), lr=3e-3),
    }
    backbone_moved, head_moved = [], []
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.__enter__()
    for step in range(STEPS):
        x, y = make(step)
        opt = optimizers[schedule(step)]
        before = (model[0].weight.detach().clone(), model[4].weight.detach().clone())
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        backbone_moved.append(not torch.equal(before[0], model[0].weight))
        head_moved.append(not torch.equal(before[1], model[4].weight))
    if dbg is not None:
        dbg.__exit__(None, None, None)
    with torch.no_grad():
        accuracy = float((model(HELD_OUT[0]).argmax(1) == HELD_OUT[1]).float().mean())
    return accuracy, backbone_moved, head_moved, dbg


def frozen(dbg: NeuralDbg | None) -> list[SemanticEvent]:
    assert dbg is not None
    return [e for e in dbg.events if e.kind is FailureKind.FROZEN_PARAMETERS]


def test_a_backbone_left_out_while_probing_and_fine_tuned_by_a_new_optimizer_is_not_frozen() -> None:
    twin, _, _, _ = run(lambda step: "all", watched=False)
    accuracy, backbone_moved, _, _ = run(lpft, watched=False)
    # plain torch: the backbone is still while the head is probed, moves at every step after, and the model ends
    # where the one-phase twin does (chance is about 0.25)
    assert not any(backbone_moved[:PHASE]) and all(backbone_moved[PHASE:])
    assert accuracy > 0.8 and abs(accuracy - twin) < 0.03, (accuracy, twin)

    watched, _, _, dbg = run(lpft, watched=True)
    assert watched == accuracy  # the debugger changes nothing
    assert not frozen(dbg), dbg and dbg.report()
    assert dbg is not None and dbg.healthy, dbg.explain_failure()


def test_two_optimizers_stepped_in_turn_leave_nothing_frozen() -> None:
    accuracy, backbone_moved, head_moved, dbg = run(in_turn, watched=True)
    # plain torch: each part moves on its own turns only, the head first at step 80; the model learns the task
    assert all(backbone_moved[:PHASE]) and not any(head_moved[:PHASE])
    assert all(head_moved[PHASE : 2 * PHASE]) and not any(backbone_moved[PHASE : 2 * PHASE])
    assert accuracy > 0.8, accuracy
    assert not frozen(dbg), dbg and dbg.report()
    assert dbg is not None and dbg.healthy, dbg.explain_failure()


def test_a_probe_whose_fine_tuning_was_forgotten_is_frozen() -> None:
    twin, _, _, _ = run(lpft, watched=False)
    accuracy, backbone_moved, _, dbg = run(lambda step: "head", watched=True)
    # plain torch: the backbone never moves, and the probe alone stays below the fine-tuned model
    assert not any(backbone_moved) and accuracy < twin - 0.05, (accuracy, twin)
    events = frozen(dbg)
    assert {e.layer for e in events} == {"0", "2"}, dbg and dbg.report()
    assert all(e.metrics.get("ongoing") == 1.0 for e in events)


def test_a_layer_joined_only_for_the_last_quarter_is_still_frozen_for_the_steps_it_was_left_out() -> None:
    late = 3 * STEPS // 4
    _, backbone_moved, _, dbg = run(lambda step: "head" if step < late else "all", watched=True)
    assert not any(backbone_moved[:late]) and all(backbone_moved[late:])  # plain torch
    events = frozen(dbg)
    assert {e.layer for e in events} == {"0", "2"}, dbg and dbg.report()
    assert all(e.step_end < late for e in events)


def _undone(end: int, moves: list[int], last: int) -> bool:
    """Whether a frozen phase of steps 0 to ``end`` is undone, the layer's updates read moving at ``moves`` after it
    and the run's last fully observed step ``last``."""
    history = History(64)
    for step in range(0, end + 1, 16):
        history.add("update_ratio", "fc", step, 0.0)
    for step in moves:
        history.add("update_ratio", "fc", step, 1e-3)
    metrics = {"grad_norm": 1.0, "in_optimizer": 0.0, "lr": 0.0}
    event = SemanticEvent(
        EventType.UPDATE, FailureKind.FROZEN_PARAMETERS, "fc", "fc.weight", 0, end, None, UpdateHealth.FROZEN, metrics
    )
    coverage = Coverage()
    coverage.last_full_step = last
    return FrozenParameters().undone(event, coverage, RunFacts(1, 200, 200, history=history))


@pytest.mark.parametrize(
    ("end", "moves", "last", "undone"),
    [
        (80, [96, 112, 128], 256, True),  # still to 80, moving from 96: 160 steps to come, held for 96
        (80, [96, 112], 160, False),  # ... in a run that ended at 160: no more to come than it was held
        (48, [64, 80, 96, 112], 119, False),  # joined for the last half: the layer added to the optimizer mid-run
        (80, [], 256, False),  # never moved after the phase
    ],
)
def test_a_frozen_phase_is_undone_only_when_measured_updates_ended_it_early_enough(
    end: int, moves: list[int], last: int, undone: bool
) -> None:
    assert _undone(end, moves, last) is undone
