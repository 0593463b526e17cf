"""The rules behind the verdicts, each pinned so that breaking it fails a test.

Each section names the rule and what a user would see if it were inverted or deleted: an explosion hidden by
gradient clipping, a one-step blip reported as a failure, a converged fit called vanishing or stalled, a learning
rate of 0 reported as every parameter frozen. The faults are real (checked with plain torch in each test) and
each has a twin that must stay silent.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable
from typing import NamedTuple

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import DebugConfig, EventType, FailureKind, NeuralDbg, SemanticEvent
from neuraldbg.analysis.tracker import Tracker
from neuraldbg.capture.measure import clip_factor
from neuraldbg.detectors.base import Finding, Observation
from neuraldbg.queries import Queries
from neuraldbg.reasoning import CausalRule, Topology
from neuraldbg.stats.history import History
from pytest_neuraldbg.assertions import assert_no_dead_neurons

# ------------------------------------------------------------------------------------- gradient clipping
#
# clip_grad_norm_ hides an explosion, it does not cure it: the gradient detector judges the norms the backward
# pass left (the norms the optimizer received, times the clip factor), while the grad_norm history records what
# the optimizer received.


def layer_norms(model: nn.Module) -> dict[str, float]:
    """Plain torch: each child layer's gradient norm over its own parameters."""
    return {
        name: math.sqrt(sum(float(p.grad.norm()) ** 2 for p in layer.parameters()))
        for name, layer in model.named_children()
        if any(True for _ in layer.parameters())
    }


def clipped_training(
    blow_up: float, steps: int = 12
) -> tuple[NeuralDbg, list[dict[str, float]], list[dict[str, float]]]:
    """An MLP whose middle layer's weights are multiplied by ``blow_up``, trained with clip_grad_norm_(1.0).
    Returns the debugger, and per step the layer norms before and after clipping (plain torch)."""
    torch.manual_seed(0)
    model = support.mlp(width=16, depth=2)
    with torch.no_grad():
        model[2].weight.mul_(blow_up)
    batches = support.regression_batches()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    before: list[dict[str, float]] = []
    after: list[dict[str, float]] = []
    with NeuralDbg(model, preset="full") as dbg:
        for step in range(steps):
            x, y = batches(step)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            before.append(layer_norms(model))
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            after.append(layer_norms(model))
            opt.step()
    return dbg, before, after


@pytest.fixture(scope="module")
def clipped_explosion() -> tuple[NeuralDbg, list[dict[str, float]], list[dict[str, float]]]:
    return clipped_training(blow_up=3000.0)


def test_an_explosion_hidden_by_gradient_clipping_is_judged_on_the_norms_before_clipping(clipped_explosion):
    dbg, before, after = clipped_explosion
    # plain torch: the backward pass leaves norms above 1e4 at every step, the optimizer receives at most 1
    assert all(max(norms.values()) > 1e4 for norms in before)
    assert all(math.hypot(*norms.values()) <= 1.0 + 1e-4 for norms in after)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.EXPLODING_GRADIENTS, dbg.report()
    assert top.root.step_start == 0
    exploding = [e for e in dbg.events if e.kind is FailureKind.EXPLODING_GRADIENTS]
    assert exploding and all(e.step_start == 0 for e in exploding)
    for event in exploding:  # the event reports the norm before clipping, and what clipping cut it to
        m = event.metrics
        step = next(s for s, norms in enumerate(after) if norms[event.layer] == pytest.approx(m["clipped_grad_norm"]))
        assert m["grad_norm"] == pytest.approx(before[step][event.layer], rel=1e-3)
        assert m["clip_factor"] == pytest.approx(math.hypot(*before[step].values()), rel=1e-3)


def test_the_gradient_norm_history_records_what_the_optimizer_received_after_clipping(clipped_explosion):
    dbg, _, after = clipped_explosion
    for layer in after[0]:
        recorded = dict(dbg.history.get("grad_norm", layer).points())
        assert set(recorded) == set(range(len(after)))
        for step, value in recorded.items():
            assert value == pytest.approx(after[step][layer], rel=1e-4), (layer, step)


def test_clipping_a_healthy_net_neither_hides_nor_invents_a_fault():
    dbg, before, _ = clipped_training(blow_up=1.0, steps=30)
    # plain torch: clipping really cut the norms (so the clip factor is above 1), and they were never large
    assert all(math.hypot(*norms.values()) > 1.0 for norms in before[:5])
    assert all(max(norms.values()) < 100 for norms in before)
    assert dbg.hypotheses() == [], dbg.report()


def test_the_clip_factor_is_the_ratio_of_total_norms_and_only_when_clipping_cut_them():
    assert clip_factor([3.0, 4.0], [30.0, 40.0]) == pytest.approx(10.0)  # total 50 cut to 5
    assert clip_factor([3.0, 4.0], [3.0, 4.0]) is None  # nothing cut
    assert clip_factor([3.0, 4.0], [3.0, 4.02]) is None  # within 1 %: rounding, not clipping
    assert clip_factor([3.0, 4.0], [24.0, 32.0]) is None  # exactly 8x: a GradScaler unscaling, not clipping
    assert clip_factor([3.0, 4.0], []) is None  # the raw norms were not read this step
    assert clip_factor([0.0, 0.0], [3.0, 4.0]) is None  # nothing reached the optimizer to compare with


# ------------------------------------------------------------------------------------- persistence
#
# A state becomes an event once it holds for ``persistence`` (3) observations spanning ``persistence_steps`` (5)
# steps. The observations here are 8 steps apart (a sparse schedule), so the span never decides: the count does.

DEAD = Finding(EventType.ACTIVATION, FailureKind.DEAD_NEURONS, "3", "dead", {"dead_fraction": 1.0}, 1.0)
GAP = 8


def observe(tracker: Tracker, states: list[Finding | None]) -> None:
    for i, finding in enumerate(states):
        obs = Observation()
        obs.saw(EventType.ACTIVATION, "3")
        if finding is not None:
            obs.findings.append(finding)
        tracker.update(i * GAP, [("dead", obs)])


@pytest.mark.parametrize("held", [2, 3])
def test_a_state_that_resolves_is_an_event_after_three_observations_not_two(held: int):
    tracker = Tracker(DebugConfig())  # the default persistence
    observe(tracker, [DEAD] * held + [None])
    events = tracker.events(final=True)
    if held < 3:
        assert events == []
    else:
        (event,) = events
        assert (event.step_start, event.step_end) == (0, (held - 1) * GAP)


@pytest.mark.parametrize("final", [False, True], ids=["mid-run", "at the end"])
@pytest.mark.parametrize("held", [2, 3])
def test_a_state_still_holding_is_an_event_after_three_observations_not_two(held: int, final: bool):
    tracker = Tracker(DebugConfig())
    observe(tracker, [DEAD] * held)
    events = tracker.events(final=final)
    if held < 3:
        assert events == []
    else:
        (event,) = events
        assert (event.step_start, event.metrics["ongoing"]) == (0, 1.0)


def test_a_layer_dead_for_two_observed_steps_of_a_real_run_is_not_reported_and_for_three_it_is():
    torch.manual_seed(0)
    model = support.mlp(width=16, depth=2)
    batches = support.regression_batches()
    alive = model[2].bias.detach().clone()

    def dead_fraction(bias: torch.Tensor, step: int) -> float:  # plain torch, on a copy
        copied = copy.deepcopy(model)
        with torch.no_grad():
            copied[2].bias.copy_(bias)
        return support.dead_unit_fraction(support.capture_outputs(copied, batches(step)[0], ["3"])["3"])

    killed = torch.full_like(alive, -100.0)
    assert all(dead_fraction(killed, step) == 1.0 for step in range(4, 7))
    assert all(dead_fraction(alive, step) < 0.5 for step in range(12))

    def run(dead_steps: set[int]) -> NeuralDbg:
        def on_step(step: int, _: torch.optim.Optimizer) -> None:
            with torch.no_grad():
                model[2].bias.copy_(killed if step in dead_steps else alive)

        # every step observed, and no minimum span: the count of observations alone decides
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # only this test moves the weights: both runs alike
        dbg, _ = support.train(model, batches, steps=12, optimizer=opt, on_step=on_step, persistence_steps=1)
        return dbg

    twice = run({4, 5})
    assert not any(e.kind is FailureKind.DEAD_NEURONS for e in twice.events), twice.report()
    thrice = run({4, 5, 6})
    (event,) = [e for e in thrice.events if e.kind is FailureKind.DEAD_NEURONS]
    assert (event.layer, event.step_start, event.step_end) == ("3", 4, 6)


class RecordedRun(Queries):
    """A run with no events, a dead-fraction history and a config: the engine judges ``max_fraction`` over it."""

    def __init__(self, fractions: list[float], config: dict[str, object]) -> None:
        self.history = History(64)
        for step, value in enumerate(fractions):
            self.history.add("dead_fraction", "act", step, value)
        self.config = config

    def _current(self) -> tuple[list[SemanticEvent], Topology, list[CausalRule]]:
        return [], Topology(order=["act"], types={"act": "ReLU"}, roles={"act": "gated"}), []

    def _meta(self) -> dict[str, object]:
        return {"config": self.config}


@pytest.mark.parametrize("config", [{"persistence": 3}, {}], ids=["recorded", "not recorded: the default"])
def test_max_fraction_fails_a_layer_above_it_for_three_recorded_steps_not_two(config: dict[str, object]):
    assert_no_dead_neurons(RecordedRun([0.1, 0.5, 0.5, 0.1, 0.1], config), max_fraction=0.2)
    with pytest.raises(AssertionError, match=r"dead_neurons at 'act' from step 1 \(above max_fraction 0.2\)"):
        assert_no_dead_neurons(RecordedRun([0.1, 0.5, 0.5, 0.5, 0.1], config), max_fraction=0.2)


# ------------------------------------------------------------------------------------- convergence
#
# A fit that converged has tiny gradients and tiny updates because the loss has nothing left to give: that is
# neither vanishing gradients nor stalled updates. The fit here is a classifier on separable data with a margin:
# its logits grow until the loss is ~1e-10 of where it started.


def separable_batches(margin: float = 2.0, batch: int = 64) -> Callable[[int], support.Batch]:
    """Labels from a fixed linear teacher; each point pushed ``margin`` away from its boundary."""
    w = torch.randn(4, generator=torch.Generator().manual_seed(5))
    w = w / w.norm()

    def make(step: int) -> support.Batch:
        x = torch.randn(batch, 4, generator=torch.Generator().manual_seed(100 + step))
        side = torch.sign(x @ w)
        return x + margin * side.unsqueeze(1) * w, (side > 0).float().unsqueeze(1)

    return make


class Fit(NamedTuple):
    dbg: NeuralDbg
    losses: list[float]  # per step, and the rest measured with plain torch
    norms: list[dict[str, float]]  # each layer's gradient norm
    moved: list[bool]  # whether the optimizer changed any weight


def confident_fit(steps: int = 60, schedule: Callable[[int], float] | None = None) -> Fit:
    """Adam on the separable task; ``schedule``: a learning-rate factor per step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    lr_schedule = torch.optim.lr_scheduler.LambdaLR(opt, schedule) if schedule is not None else None
    batches = separable_batches()
    fit = Fit(NeuralDbg(model), [], [], [])
    with fit.dbg:
        for step in range(steps):
            x, y = batches(step)
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(x), y)
            loss.backward()
            fit.losses.append(loss.item())
            fit.norms.append(layer_norms(model))
            before = [p.detach().clone() for p in model.parameters()]
            opt.step()
            fit.moved.append(any(not torch.equal(b, p) for b, p in zip(before, model.parameters())))
            if lr_schedule is not None:
                lr_schedule.step()
    return fit


@pytest.fixture(scope="module")
def converged() -> Fit:
    return confident_fit()


def test_a_fit_that_converged_is_not_vanishing_though_its_gradients_are_below_the_floor(converged: Fit):
    # plain torch: the loss fell by eight orders of magnitude, and every layer's gradient fell below 1e-9
    assert converged.losses[-1] < 1e-8 * converged.losses[0]
    below = [step for step, n in enumerate(converged.norms) if max(n.values()) < DebugConfig().vanishing_floor]
    assert len(below) >= 10
    assert not any(e.kind is FailureKind.VANISHING_GRADIENTS for e in converged.dbg.events), converged.dbg.report()


def test_a_fit_that_converged_under_adam_gets_no_hypothesis_at_all(converged: Fit):
    assert converged.dbg.hypotheses() == [], converged.dbg.report()


def test_a_fit_that_converged_before_its_schedule_reached_zero_is_not_stalled():
    fit = confident_fit(steps=60, schedule=lambda step: 1.0 if step < 40 else 0.0)
    # plain torch: converged, and from step 40 the optimizer changes nothing
    assert fit.losses[-1] < 1e-8 * fit.losses[0]
    assert all(fit.moved[:40]) and not any(fit.moved[40:])
    assert not any(e.kind is FailureKind.STALLED_UPDATES for e in fit.dbg.events), fit.dbg.report()
    assert fit.dbg.hypotheses() == []


def test_a_regression_that_converged_under_plain_sgd_is_not_stalled_though_its_updates_are_tiny():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 1))  # a linear regressor with a linear bottleneck
    teacher = torch.randn(8, 1, generator=torch.Generator().manual_seed(7))

    def batches(step: int) -> support.Batch:  # noise-free targets: the model can fit them exactly
        x = torch.randn(32, 8, generator=torch.Generator().manual_seed(100 + step))
        return x, x @ teacher

    ratios: list[float] = []  # plain torch: the median update/weight ratio of the two layers at each step

    def on_step(step: int, _: torch.optim.Optimizer) -> None:
        if step:
            ratios.append(statistics.median(float((w - w0).norm() / w.norm()) for w, w0 in zip(weights(), kept)))
        kept[:] = [w.clone() for w in weights()]

    def weights() -> list[torch.Tensor]:
        return [torch.cat([p.detach().flatten() for p in layer.parameters()]) for layer in model]

    kept: list[torch.Tensor] = []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg, losses = support.train(model, batches, steps=60, optimizer=opt, on_step=on_step)
    assert losses[-1] < 1e-10 * losses[0]  # converged: eleven orders of magnitude
    stalled = DebugConfig().stalled_ratio
    assert sum(r < stalled for r in ratios[30:]) >= 25  # with updates far below the stalled ratio
    assert not any(e.kind is FailureKind.STALLED_UPDATES for e in dbg.events), dbg.report()
    assert dbg.hypotheses() == []


# ------------------------------------------------------------------------------------- learning rate 0
#
# When no parameter moves at all, the learning rate is 0 everywhere: one global stall, not every parameter
# frozen. (Frozen is a parameter left out of the optimizer, or in a group of its own with learning rate 0, while
# the rest of the model moves: see test_detection.py.)


def test_a_learning_rate_of_zero_everywhere_is_stalled_updates_not_frozen_parameters():
    torch.manual_seed(0)
    model = support.mlp()
    start = copy.deepcopy(model.state_dict())
    dbg, losses = support.train(
        model, support.regression_batches(), optimizer=torch.optim.SGD(model.parameters(), lr=0.0)
    )
    # plain torch: nothing moved, and the loss did not fall
    assert all(torch.equal(start[k], v) for k, v in model.state_dict().items())
    assert sum(losses[-10:]) > 0.5 * sum(losses[:10])

    assert [h.kind for h in dbg.hypotheses()] == [FailureKind.STALLED_UPDATES], dbg.report()
    assert not any(e.kind is FailureKind.FROZEN_PARAMETERS for e in dbg.events)
    root = dbg.hypotheses()[0].root
    assert (root.layer, root.step_start, root.metrics["median_update_ratio"]) == ("", 0, 0.0)
