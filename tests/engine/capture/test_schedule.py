"""Which steps get full statistics: dense at the start, sparse later, dense windows after a trigger, and a dense
phase that thins out for models of many modules (whose full steps cost more than a training step)."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import DebugConfig, FailureKind, NeuralDbg
from neuraldbg.capture.schedule import Schedule


def full_steps(schedule: Schedule, upto: int) -> list[int]:
    return [step for step in range(upto) if schedule.is_full(step)]


def test_a_small_model_is_observed_every_step_at_first_then_on_a_sparse_schedule():
    schedule = Schedule(DebugConfig(), modules=10)
    assert full_steps(schedule, 40) == [*range(16), 16, 32]
    assert [s for s in range(250, 400) if schedule.is_full(s)] == [256, 320, 384]


def test_a_trigger_observes_a_window_of_steps_and_a_later_trigger_extends_it():
    schedule = Schedule(DebugConfig(), modules=10)
    schedule.trigger(40)
    assert [s for s in range(36, 60) if schedule.is_full(s)] == [*range(40, 48), 48]
    schedule.trigger(45)
    assert [s for s in range(36, 60) if schedule.is_full(s)] == [*range(40, 53)]


def test_a_model_of_many_modules_thins_its_dense_phase_and_its_windows():
    schedule = Schedule(DebugConfig(), modules=400)  # 400 modules, 128 per dense step: every 4th step
    assert full_steps(schedule, 40) == [0, 4, 8, 12, 16, 32]
    schedule.trigger(40)
    assert [s for s in range(36, 60) if schedule.is_full(s)] == [40, 44, 48]
    assert full_steps(Schedule(DebugConfig(dense_modules=1000), modules=400), 17) == list(range(17))
    assert full_steps(Schedule(DebugConfig(dense_stride=2), modules=10), 17) == [0, 2, 4, 6, 8, 10, 12, 14, 16]


def test_a_deep_narrow_net_is_observed_sparsely_and_its_dead_layer_still_found_from_step_0():
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(70):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(64, 1))  # 141 modules: every 2nd step of the dense phase
    dead_layer = str(len(model) - 2)
    with torch.no_grad():
        model[-3].bias.fill_(-20.0)  # the last ReLU is dead from the first step
    batches = support.regression_batches(in_features=64)
    relus = [str(i) for i in range(1, len(model), 2)]
    probe = support.capture_outputs(model, batches(0)[0], relus)
    truly_dead = {name for name in relus if bool((probe[name] <= 0).all())}  # plain torch, at step 0
    assert dead_layer in truly_dead
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model) as dbg:
        for step in range(30):
            x, y = batches(step)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    assert dbg.meta["full_steps"] < 16  # not every step of the dense phase
    found = {(e.layer, e.step_start) for h in dbg.hypotheses() for e in h.chain if e.kind is FailureKind.DEAD_NEURONS}
    assert (dead_layer, 0) in found
    assert {layer for layer, _ in found} <= truly_dead  # nothing reported dead that plain torch saw alive
