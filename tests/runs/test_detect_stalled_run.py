"""A run whose updates add up to almost nothing: each step moves the weights by more than the per-step stall limit,
yet over the whole run the weights move by a few percent of their norm and the loss shows the model did not train
(it stays at chance, or it is still falling at its full pace when the run ends). Ground truth is plain torch in
each test: the same loop at a sound learning rate trains, the faulty one does not; healthy twins stay silent."""

from __future__ import annotations

import math
from collections.abc import Callable

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.events import EventType
from neuraldbg.kinds import stalled_updates

CLASSES = 10
STEPS = 120
RUN = EventType.RUN


def classifier() -> nn.Sequential:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def regressor() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 512), nn.Tanh(), nn.Linear(512, 1))


def offset_targets() -> Callable[[int], support.Batch]:
    """A learnable regression whose targets are not centred (a mean of 5): a model must move its output far."""
    base = support.regression_batches(16, batch=128)

    def make(step: int) -> support.Batch:
        x, y = base(step)
        return x, 0.25 * y + 5.0

    return make


def run(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    make: Callable[[int], support.Batch],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    watched: bool,
    clip: float | None = None,
) -> tuple[list[float], list[float], NeuralDbg | None]:
    """A user's loop (no NeuralDBG call inside): the losses, and each step's update/weight ratio measured with
    plain torch (||dW|| / ||W|| over all parameters)."""
    losses: list[float] = []
    ratios: list[float] = []

    def loop() -> None:
        for step in range(STEPS):
            x, y = make(step)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            before = [p.detach().clone() for p in model.parameters()]
            optimizer.step()
            delta = math.sqrt(sum(float((p.detach() - b).pow(2).sum()) for p, b in zip(model.parameters(), before)))
            weight = math.sqrt(sum(float(b.pow(2).sum()) for b in before))
            ratios.append(delta / weight)
            losses.append(float(loss.detach()))

    if not watched:
        loop()
        return losses, ratios, None
    with NeuralDbg(model) as dbg:
        loop()
    return losses, ratios, dbg


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def stalled_run_events(dbg: NeuralDbg) -> list:
    """The findings about the whole run (not the per-step rule's)."""
    return [e for e in dbg.events if e.kind is not None and e.kind.value == "stalled_updates" and e.event_type is RUN]


def test_a_classifier_whose_updates_add_up_to_almost_nothing_stays_at_chance_and_is_found():
    make = support.classification_batches((32,), CLASSES, batch=64)

    def train(lr: float, watched: bool) -> tuple[list[float], list[float], NeuralDbg | None]:
        torch.manual_seed(0)
        model = classifier()
        return run(model, torch.optim.SGD(model.parameters(), lr=lr), make, F.cross_entropy, watched)

    # plain torch: at lr 1e-3 the loss stays within 5 % of log(10) and the run's ratios add up to ~1e-2, while each
    # step's ratio is above the per-step stall limit (the per-step rule cannot see it); at lr 0.5 the model learns
    losses, ratios, _ = train(1e-3, watched=False)
    twin, _, _ = train(0.5, watched=False)
    chance = math.log(CLASSES)
    assert abs(mean(losses[-30:]) - chance) < 0.05 * chance
    assert mean(twin[-30:]) < 0.6 * chance
    assert sum(ratios) < 0.05 and min(ratios) > 1e-5

    _, _, dbg = train(1e-3, watched=True)
    assert dbg is not None
    found = stalled_run_events(dbg)
    assert found, dbg.explain_failure()
    assert found[0].metrics["shape"] == stalled_updates.SHAPES["chance"]
    assert found[0].metrics["run_updates"] < 0.05
    assert dbg.hypotheses()[0].kind.value == "stalled_updates"
    assert "learning rate" in dbg.explain_failure()[0]

    _, _, healthy = train(0.5, watched=True)
    assert healthy is not None and healthy.healthy, healthy.explain_failure()


def test_a_regression_stopped_while_its_loss_still_falls_at_full_pace_is_found():
    make = offset_targets()

    def train(lr: float, watched: bool) -> tuple[list[float], list[float], NeuralDbg | None]:
        torch.manual_seed(0)
        model = regressor()
        return run(model, torch.optim.Adam(model.parameters(), lr=lr), make, F.mse_loss, watched)

    # plain torch: at lr 4e-5 the loss falls steadily and is still falling at the end (its second half falls by
    # 0.3 of its whole fall or more) with the run's ratios adding up to 2 %; at lr 1e-2 it fits
    losses, ratios, _ = train(4e-5, watched=False)
    twin, _, _ = train(1e-2, watched=False)
    start, end = mean(losses[:15]), mean(losses[-30:])
    half = mean(losses[60:80]) - mean(losses[-20:])
    assert end < start and half >= 0.3 * (start - end)
    assert mean(twin[-30:]) < 0.1 * end
    assert sum(ratios) < 0.05 and min(ratios) > 1e-5

    _, _, dbg = train(4e-5, watched=True)
    assert dbg is not None
    found = stalled_run_events(dbg)
    assert found, dbg.explain_failure()
    assert found[0].metrics["shape"] == stalled_updates.SHAPES["falling"]

    _, _, healthy = train(1e-2, watched=True)
    assert healthy is not None and healthy.healthy, healthy.explain_failure()


def test_a_regression_that_learnt_only_its_targets_mean_and_crawls_on_is_found():
    """SGD at a learning rate far too low on targets of mean 2: the output's bias learns the mean first (the loss
    falls from above the targets' variance to below it), then the fit crawls. Against the whole fall the second
    half's is small, as a fit nearing its plateau's is; against the fall below the targets' variance, the part that
    is fitting, it is not."""
    base = support.regression_batches(16, batch=128)

    def make(step: int) -> support.Batch:
        x, y = base(step)
        return x, y + 2.0

    def train(lr: float, watched: bool) -> tuple[list[float], list[float], NeuralDbg | None]:
        torch.manual_seed(0)
        model = regressor()
        return run(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), make, F.mse_loss, watched)

    losses, ratios, _ = train(3e-5, watched=False)
    twin, _, _ = train(3e-3, watched=False)
    variance = float(torch.cat([make(i)[1] for i in range(8)]).var(correction=0))
    start, end = mean(losses[:8]), mean(losses[-30:])
    half = mean(losses[60:80]) - mean(losses[-20:])
    assert start > variance > end  # the mean learnt, and then some of the fit
    assert 0.3 * (variance - end) <= half < 0.3 * (start - end)
    assert sum(ratios) < 0.05 and min(ratios) > 1e-5
    assert mean(twin[-30:]) < 0.05 * end  # plain torch: at 100x the learning rate it fits

    _, _, dbg = train(3e-5, watched=True)
    assert dbg is not None
    found = stalled_run_events(dbg)
    assert found, dbg.explain_failure()
    assert found[0].metrics["shape"] == stalled_updates.SHAPES["falling"]
    assert "raise the learning rate" in dbg.explain_failure()[0]

    _, _, healthy = train(3e-3, watched=True)
    assert healthy is not None and healthy.healthy, healthy.explain_failure()


def test_sgd_clipped_to_a_tiny_norm_is_found_and_the_fix_names_the_clipping():
    make = support.classification_batches((32,), CLASSES, batch=64)

    def train(clip: float, watched: bool) -> tuple[list[float], list[float], NeuralDbg | None]:
        torch.manual_seed(0)
        model = classifier()
        return run(model, torch.optim.SGD(model.parameters(), lr=0.5), make, F.cross_entropy, watched, clip=clip)

    losses, ratios, _ = train(1e-3, watched=False)
    twin, _, _ = train(1.0, watched=False)
    chance = math.log(CLASSES)
    assert abs(mean(losses[-30:]) - chance) < 0.05 * chance
    assert mean(twin[-30:]) < 0.6 * chance
    assert sum(ratios) < 0.05

    _, _, dbg = train(1e-3, watched=True)
    assert dbg is not None and stalled_run_events(dbg), dbg.explain_failure()
    assert "clip_grad_norm_" in dbg.explain_failure()[0]
    assert "clip_value of clip_grad_value_" in dbg.explain_failure()[0]  # the other way of clipping, named too
    _, _, healthy = train(1.0, watched=True)
    assert healthy is not None and healthy.healthy, healthy.explain_failure()


def test_a_fine_tune_whose_head_learns_fast_on_a_large_slow_backbone_stays_silent():
    """The whole model's ratios add up to almost nothing (a large backbone at a tiny learning rate), but the head
    learns and the loss reaches its plateau: a fit, not a stall."""
    make = support.classification_batches((32,), CLASSES, batch=64)

    def train(watched: bool) -> tuple[list[float], list[float], NeuralDbg | None]:
        torch.manual_seed(0)
        backbone = nn.Sequential(nn.Linear(32, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU())
        with torch.no_grad():
            for p in backbone.parameters():
                p.mul_(4.0)  # 'pretrained' weights of a much larger norm than the head's
        head = nn.Linear(512, CLASSES)
        model = nn.Sequential(backbone, head)
        opt = torch.optim.Adam([{"params": backbone.parameters(), "lr": 1e-5}, {"params": head.parameters()}], 1e-3)
        return run(model, opt, make, F.cross_entropy, watched)

    losses, ratios, _ = train(watched=False)
    chance = math.log(CLASSES)
    start, end = mean(losses[:15]), mean(losses[-30:])
    assert sum(ratios) < 0.05  # by the whole model's ratios alone this run would stall
    assert end < 0.5 * start and end < 0.8 * chance  # ... but it trained to a plateau
    assert mean(losses[60:80]) - mean(losses[-20:]) < 0.3 * (start - end)

    _, _, dbg = train(watched=True)
    assert dbg is not None and dbg.healthy, dbg.explain_failure()


def test_a_short_run_still_falling_whose_steps_are_of_a_sound_size_stays_silent():
    """The same regression at lr 4e-4: still falling at the end, but its steps add up to a sixth of the weights'
    norm and the loss fell by two thirds: a short run, not a stalled one."""
    make = offset_targets()
    torch.manual_seed(0)
    model = regressor()
    losses, ratios, _ = run(model, torch.optim.Adam(model.parameters(), lr=4e-4), make, F.mse_loss, False)
    start, end = mean(losses[:15]), mean(losses[-30:])
    assert end < 0.4 * start
    assert mean(losses[60:80]) - mean(losses[-20:]) >= 0.3 * (start - end)  # still falling at the end
    assert sum(ratios) > 0.1

    torch.manual_seed(0)
    model = regressor()
    _, _, dbg = run(model, torch.optim.Adam(model.parameters(), lr=4e-4), make, F.mse_loss, True)
    assert dbg is not None and dbg.healthy, dbg.explain_failure()
