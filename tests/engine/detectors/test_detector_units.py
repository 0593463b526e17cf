"""Detector thresholds on hand-made step statistics: exact boundaries, counters, resets and the guards between
them (dead units, parameter updates, gradients).

The statistics are what the recorder files (dead units out of units, gradient and update norms, learning rates,
the loss gradient); a small model supplies only the layer names and roles. Each case pins a boundary or a counter
that training runs rarely land on exactly, and that a changed comparison, constant or reset would move (found with
mutmut: these mutants survived the training-run tests).
"""

from __future__ import annotations

import math

import pytest
from torch import nn

from neuraldbg import DebugConfig, EventType, FailureKind
from neuraldbg.analysis.tracker import Tracker
from neuraldbg.detectors.base import Context, Finding, StepView
from neuraldbg.kinds.dead_neurons import DeadUnitsDetector
from neuraldbg.model.info import owner_of_params
from neuraldbg.model.layers import describe
from neuraldbg.stats.step import SlotKey, StepData

MODEL = nn.Sequential(nn.Linear(4, 10), nn.ReLU(), nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 1))
RELU: SlotKey = ("1", 0)
OTHER_RELU: SlotKey = ("3", 0)


def context() -> Context:
    infos = describe(MODEL, DebugConfig().saturation_derivative)
    order = [(name, 0) for name in ("0", "1", "2", "3", "4", "")]
    return Context(DebugConfig(), infos, order, owner_of_params(infos))


def relu_step(
    step: int, dead: int, units: int = 10, batch: int = 8, key: SlotKey = RELU, functional: bool = False
) -> StepData:
    """A step at which ``dead`` of the ReLU's ``units`` were inactive on every one of ``batch`` samples."""
    data = StepData(step, True, act={key: 1.0}, numel={key: units * batch})
    (data.func_dead if functional else data.dead)[key] = (float(dead), units)
    return data


def findings(steps: list[StepData]) -> list[list[Finding]]:
    detector, ctx = DeadUnitsDetector(), context()
    out = []
    for data in steps:
        obs = detector.observe(StepView(data, ctx))
        out.append(obs.findings if obs is not None else [])
    return out


def test_seventy_percent_of_a_layers_units_dead_is_a_dead_layer_and_half_of_them_dates_one():
    (at_threshold,), (onset,), (between,), below = findings(
        [relu_step(0, 28, units=40), relu_step(1, 20, units=40), relu_step(2, 24, units=40), relu_step(3, 16, units=40)]
    )
    assert (at_threshold.event_type, at_threshold.kind, at_threshold.layer) == (
        EventType.ACTIVATION,
        FailureKind.DEAD_NEURONS,
        "1",
    )
    assert at_threshold.state == "dead" and not at_threshold.provisional  # at least 70 %: dead
    assert at_threshold.metrics == {"dead_fraction": 0.7, "dead_units": 28.0, "units": 40.0}
    assert at_threshold.strength == 0.0  # at the threshold
    assert onset.provisional and between.provisional  # from 50 %: dates the event, does not confirm it
    assert below == []


def test_a_layer_of_ten_units_is_dead_from_nine_not_from_seven():
    """Under 32 units, more dead units than chance gives: 7 of 10 are off by chance in 17 % of initialisations
    where each unit is off with probability 1/2, 9 of 10 in 1 %."""
    (seven,), (nine,) = findings([relu_step(0, 7), relu_step(1, 9)])
    assert seven.provisional  # dates the event, does not confirm it
    assert not nine.provisional and nine.metrics["dead_fraction"] == 0.9


@pytest.mark.parametrize(("dead", "strength"), [(10, 1.0), (85, 0.5)])
def test_the_strength_of_a_dead_layer_runs_from_the_threshold_to_every_unit(dead: int, strength: float):
    ((finding,),) = findings([relu_step(0, dead, units=10 if dead == 10 else 100)])
    assert finding.strength == pytest.approx(strength)


def test_a_layer_of_one_unit_that_is_dead_is_a_dead_layer():
    ((finding,),) = findings([relu_step(0, 1, units=1)])
    assert finding.metrics["dead_fraction"] == 1.0 and not finding.provisional


def test_with_batches_of_one_a_dead_reading_is_confirmed_after_eight_observations_and_recounted_after_a_gap():
    steps = [relu_step(s, 10, batch=1) for s in range(8)]  # one observation per unit per step
    steps += [relu_step(8, 6, batch=1)]  # 60 %: no longer dead, the count starts again
    steps += [relu_step(9 + s, 10, batch=1) for s in range(8)]
    steps += [relu_step(17, 0, batch=1)]  # alive again
    steps += [relu_step(18 + s, 10, batch=1) for s in range(8)]
    provisional = [f[0].provisional if f else None for f in findings(steps)]
    # 8 observations per unit (dead_min_observations): confirmed at the 8th dead step of each run
    assert provisional[:8] == [True] * 7 + [False]
    assert provisional[8] is True  # the 60 % reading dates, does not confirm
    assert provisional[9:17] == [True] * 7 + [False]
    assert provisional[17] is None
    assert provisional[18:] == [True] * 7 + [False]


def test_with_batches_of_eight_one_dead_reading_is_enough():
    ((finding,),) = findings([relu_step(0, 10, batch=8)])
    assert not finding.provisional


def test_dead_units_of_a_functional_relu_are_marked_functional():
    (module,), (functional,) = findings([relu_step(0, 10), relu_step(1, 10, functional=True)])
    assert "functional" not in module.metrics
    assert functional.metrics["functional"] == 1.0


def test_a_non_finite_layer_output_is_not_judged_for_dead_units_and_hides_no_other_layer():
    data = relu_step(0, 10)
    data.act[RELU] = math.nan  # the layer's output went NaN: "never positive" says nothing then
    data.dead[OTHER_RELU] = (10.0, 10)
    data.act[OTHER_RELU] = 1.0
    data.numel[OTHER_RELU] = 80
    ((finding,),) = findings([data])
    assert finding.layer == "3"


def test_a_dead_layer_that_comes_back_to_life_is_an_event_that_ended():
    detector, ctx, tracker = DeadUnitsDetector(), context(), Tracker(DebugConfig(persistence_steps=1))
    for step, dead in enumerate([10, 10, 10, 0, 0]):
        obs = detector.observe(StepView(relu_step(step, dead), ctx))
        assert obs is not None
        tracker.update(step, [(detector.track_name, obs)])
    (event,) = tracker.events(final=True)
    assert (event.layer, event.step_start, event.step_end, event.to_state) == ("1", 0, 2, "dead")
    assert "ongoing" not in event.metrics


# ------------------------------------------------------------------------------------- parameter updates
#
# The update detector reads, per parameter: the gradient norm, the update ||dW|| and the weight ||W|| after it,
# and the learning rate of the group that stepped it (absent when no optimizer stepped it at this step).

UPDATE_MODEL = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))


def update_context() -> Context:
    infos = describe(UPDATE_MODEL, DebugConfig().saturation_derivative)
    order = [(name, 0) for name in ("0", "1", "2", "3", "4", "")]
    return Context(DebugConfig(), infos, order, owner_of_params(infos))


def update_step(
    step: int,
    ratios: dict[str, float],
    lr: dict[str, float | None] | None = None,
    grad: float = 1.0,
    target_grad: float | None = None,
) -> StepData:
    """Each named layer's weight moved by ``ratio`` of its norm (1.0), stepped with learning rate 0.1 unless
    ``lr`` says otherwise (None: no optimizer stepped it)."""
    data = StepData(step, True, target_grad=target_grad)
    for layer, ratio in ratios.items():
        name = f"{layer}.weight"
        data.update[name] = (ratio, 1.0)
        data.grad[name] = grad
        group_lr = (lr or {}).get(layer, 0.1)
        if group_lr is not None:
            data.stepped[name] = group_lr
    return data


def observe_updates(steps: list[StepData]) -> list[list[Finding]]:
    """What the detectors of what the optimizer did (frozen parameters, stalls, surges) find at each step."""
    from neuraldbg.kinds.frozen_parameters import FrozenDetector
    from neuraldbg.kinds.oversized_updates import UpdateSurgeDetector
    from neuraldbg.kinds.stalled_updates import StalledDetector

    detectors, ctx = [FrozenDetector(), StalledDetector(), UpdateSurgeDetector()], update_context()
    out = []
    for data in steps:
        view = StepView(data, ctx)
        found = [d.observe(view) for d in detectors]
        out.append([f for obs in found if obs is not None for f in obs.findings])
    return out


def test_a_parameter_with_a_gradient_that_no_optimizer_moved_is_frozen_with_how_it_was_left_out():
    ((left_out, zero_lr),) = observe_updates(
        [update_step(0, {"0": 0.0, "2": 0.0, "4": 1e-3}, lr={"0": None, "2": 0.0})]
    )
    assert (left_out.kind, left_out.layer, left_out.param, left_out.state) == (
        FailureKind.FROZEN_PARAMETERS,
        "0",
        "0.weight",
        "frozen",
    )
    assert left_out.metrics == {"grad_norm": 1.0, "in_optimizer": 0.0, "lr": 0.0}
    assert (zero_lr.layer, zero_lr.metrics["in_optimizer"], zero_lr.metrics["lr"]) == ("2", 1.0, 0.0)


def test_a_frozen_parameter_that_moves_again_is_an_event_that_ended():
    # the frozen detector says which parameters it looked at: one that moves again ends its state
    from neuraldbg.kinds.frozen_parameters import FrozenDetector

    detector, ctx, tracker = FrozenDetector(), update_context(), Tracker(DebugConfig(persistence_steps=1))
    left_out = [update_step(s, {"0": 0.0, "4": 1e-3}, lr={"0": None}) for s in range(4)]
    for data in [*left_out, update_step(4, {"0": 1e-3, "4": 1e-3}), update_step(5, {"0": 1e-3, "4": 1e-3})]:
        obs = detector.observe(StepView(data, ctx))
        assert obs is not None
        tracker.update(data.step, [(detector.track_name, obs)])
    (event,) = tracker.events(final=True)
    assert (event.layer, event.param, event.step_start, event.step_end) == ("0", "0.weight", 0, 3)
    assert "ongoing" not in event.metrics


def test_a_parameter_that_did_not_move_is_not_frozen_when_it_had_no_gradient_or_a_learning_rate():
    no_gradient = update_step(0, {"0": 0.0, "4": 1e-3}, lr={"0": None})
    no_gradient.grad["0.weight"] = 0.0
    too_small_to_move = update_step(1, {"0": 0.0, "4": 1e-3}, lr={"0": 1e-12})
    assert observe_updates([no_gradient, too_small_to_move]) == [[], []]


def test_a_parameter_stepped_earlier_and_idle_now_belongs_to_another_optimizers_turn():
    first, second = observe_updates(
        [
            update_step(0, {"0": 1e-3, "2": 1e-3, "4": 1e-3}),
            update_step(1, {"0": 0.0, "2": 1e-9, "4": 1e-9}, lr={"0": None}),
        ]
    )
    assert first == []
    # '0' is not frozen, and its zero update stays out of the median: the two others stalled at 1e-9
    ((stalled,),) = [second]
    assert (stalled.state, stalled.metrics["median_update_ratio"]) == ("stalled", pytest.approx(1e-9))


def test_when_nothing_moves_at_all_it_is_one_stall_of_the_model_not_every_parameter_frozen():
    ((finding,),) = observe_updates([update_step(0, {"0": 0.0, "2": 0.0, "4": 0.0}, lr={"0": 0.0, "2": 0.0, "4": 0.0})])
    assert (finding.kind, finding.layer, finding.param, finding.state) == (
        FailureKind.STALLED_UPDATES,
        "",
        None,
        "stalled",
    )
    assert finding.metrics == {"median_update_ratio": 0.0, "max_update_ratio": 0.0, "lr": 0.0}
    assert finding.strength == 1.0


@pytest.mark.parametrize(
    ("ratios", "state", "strength"),
    [
        ({"0": 1e-9, "2": 1e-8, "4": 1.0}, "stalled", 1.0),  # median 1e-8: three decades below 1e-5
        ({"0": 1e-7, "2": 1e-6, "4": 1.0}, "stalled", 1 / 3),  # median 1e-6: one decade below
        ({"0": 1e-6, "2": 1e-5, "4": 1.0}, None, None),  # median at the threshold: not below it
        ({"0": 1e-3, "2": 1e-2, "4": 1e-1}, None, None),  # a healthy spread
        ({"0": 0.1, "2": 0.1, "4": 0.01}, None, None),  # median at the oversized threshold: not above it
        ({"0": 1.0, "2": 10.0, "4": 0.01}, "exploding", 0.5),  # median 1: one decade above 0.1, of two
    ],
)
def test_the_median_update_ratio_over_the_layers_decides_a_stall_or_an_update_surge(ratios, state, strength):
    (found,) = observe_updates([update_step(0, ratios, lr={"0": 0.1, "2": 0.2, "4": 0.1})])
    if state is None:
        assert found == []
        return
    (finding,) = found
    ordered = sorted(ratios.values())
    assert (finding.layer, finding.state) == ("", state)
    assert finding.kind is (FailureKind.STALLED_UPDATES if state == "stalled" else None)
    expected = {"median_update_ratio": ordered[1], "max_update_ratio": ordered[2], "lr": 0.2}
    if state == "exploding":  # oversized updates say how large the gradients were meanwhile, and the run's largest
        expected["max_layer_grad_norm"] = 1.0
        expected["peak_update_ratio"], expected["peak_update_step"] = ordered[1], 0.0
    assert finding.metrics == expected
    assert finding.strength == pytest.approx(strength)


def test_a_layer_whose_gradient_is_exactly_zero_stays_out_of_the_median():
    data = update_step(0, {"0": 0.0, "2": 1e-3, "4": 1e-3})
    data.grad["0.weight"] = 0.0
    data.grad_exact_zero.add("0.weight")
    data.grad_numel["0.weight"] = 16
    assert observe_updates([data]) == [[]]  # without it the median would be 1e-3 anyway; with it, 0 would stall
    stalled = update_step(0, {"0": 0.0, "2": 0.0, "4": 1e-3}, lr={"0": 0.1, "2": 0.1})
    for name in ("0.weight", "2.weight"):
        stalled.grad[name] = 0.0
        stalled.grad_exact_zero.add(name)
        stalled.grad_numel[name] = 16
    assert observe_updates([stalled]) == [[]]  # only '4' counts: 1e-3 is healthy


def test_a_fit_whose_loss_gradient_fell_tenfold_from_its_first_is_not_stalled():
    tiny = {"0": 1e-9, "2": 1e-9, "4": 1e-9}
    found = observe_updates(
        [
            update_step(0, {"0": 1e-3, "2": 1e-3, "4": 1e-3}, target_grad=1.0),
            update_step(1, tiny, target_grad=0.11),  # 11 % of the first: not yet converged (fit_gradient_drop 0.1)
            update_step(2, tiny, target_grad=0.09),  # 9 %: converged
            update_step(3, tiny, target_grad=math.inf),  # a non-finite reading is not convergence
        ]
    )
    assert [f[0].state if f else None for f in found] == [None, "stalled", None, "stalled"]


def surge_confirmed(calm: list[float], surge: list[float]) -> list[bool]:
    """Whether each step of a run of large updates (median update/weight ratio 1) whose losses are ``surge`` is
    confirmed (the fit got worse while they lasted), after steps of healthy updates whose losses are ``calm``."""
    steps = [update_step(i, {"0": 1e-3, "2": 1e-3, "4": 1e-3}) for i in range(len(calm))]
    steps += [update_step(len(calm) + i, {"0": 1.0, "2": 1.0, "4": 1.0}) for i in range(len(surge))]
    for data, loss in zip(steps, [*calm, *surge]):
        data.loss = loss
    found = observe_updates(steps)
    assert found[: len(calm)] == [[]] * len(calm)
    return [not finding.provisional for (finding,) in found[len(calm) :]]


def test_large_updates_are_confirmed_against_the_last_calm_losses_not_those_of_the_whole_run():
    # a long fall from 100, eight calm readings about 1, then large updates that throw the loss to 3-4: below
    # the mean (and median) of every calm reading since the start, far above the last ones
    fall = [100.0, 90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 20.0, 10.0]
    last = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 0.98]
    assert surge_confirmed(fall + last, [1.0, 3.0, 4.0]) == [False, False, True]


def test_one_extreme_batch_among_the_calm_losses_does_not_hide_a_rise():
    # where the fit stood is the median of the calm readings: their mean, 4.6, would put 4-5 level with it
    calm = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 30.0]
    assert surge_confirmed(calm, [1.0, 4.0, 5.0]) == [False, False, True]


def test_losses_during_large_updates_within_the_noise_of_the_calm_losses_do_not_confirm_them():
    # a noisy loss (the word language model's, SGD at lr 20: 3.7-4.0 from batch to batch) whose first readings
    # during large updates happen to lie close together, just above the calm median (3.9): their own spread
    # (0.005) says nothing of the loss's noise, the calm readings' (0.15) does
    calm = [3.7, 4.1, 3.8, 4.0, 3.75, 4.05, 3.85, 3.95]
    assert surge_confirmed(calm, [3.9, 3.98, 3.99, 3.8, 4.1, 3.9]) == [False] * 6
    assert surge_confirmed(calm, [3.9, 4.5, 4.6]) == [False, False, True]  # a rise beyond that noise


# ------------------------------------------------------------------------------------- gradients
#
# The gradient detector reads each parameter's gradient norm as the optimizer received it, the clip factor, and
# the norm of d(loss)/d(output); a layer's norm is over the parameters it owns.


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)


class GradNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 4)
        self.attn = Attention()
        self.head = nn.Linear(4, 1)


GRAD_ORDER = ["embed", "attn.query", "attn.key", "attn.value", "attn", "head", ""]


def grad_context() -> Context:
    infos = describe(GradNet(), DebugConfig().saturation_derivative)
    return Context(DebugConfig(), infos, [(name, 0) for name in GRAD_ORDER], owner_of_params(infos))


def grad_step(
    step: int, norms: dict[str, float], target_grad: float | None = 0.1, clip: float | None = None
) -> StepData:
    """Each named layer's weight with this gradient norm (the loss gradient of a mean-reduced loss by default)."""
    data = StepData(step, True, target_grad=target_grad, grad_clip_factor=clip)
    for layer, norm in norms.items():
        data.grad[f"{layer}.weight"] = norm
        data.grad_numel[f"{layer}.weight"] = 16
        if norm == 0.0:
            data.grad_exact_zero.add(f"{layer}.weight")
        if not math.isfinite(norm):
            data.grad_nonfinite.add(f"{layer}.weight")
    return data


def observe_gradients(steps: list[StepData]) -> list[dict[str, Finding]]:
    """What the detectors of a layer's gradient (non-finite, exploding, vanishing) find at each step."""
    from neuraldbg.kinds.exploding_gradients import ExplodingDetector
    from neuraldbg.kinds.non_finite import NonFiniteGradientDetector
    from neuraldbg.kinds.vanishing_gradients import VanishingDetector

    detectors, ctx = [NonFiniteGradientDetector(), ExplodingDetector(), VanishingDetector()], grad_context()
    out = []
    for data in steps:
        view = StepView(data, ctx)
        found = [d.observe(view) for d in detectors]
        out.append({f.layer: f for obs in found if obs is not None for f in obs.findings})
    return out


HEALTHY = {"embed": 0.5, "attn.query": 0.3, "attn.key": 0.3, "attn.value": 0.4, "head": 1.0}


def test_a_gradient_norm_above_a_thousand_explodes_and_one_at_the_threshold_does_not():
    at, above = observe_gradients([grad_step(0, {**HEALTHY, "head": 1e3}), grad_step(1, {**HEALTHY, "head": 2e3})])
    finding = above["head"]
    assert (finding.kind, finding.state, finding.provisional, finding.decisive) == (
        FailureKind.EXPLODING_GRADIENTS,
        "exploding",
        False,
        False,
    )
    assert finding.metrics == {"grad_norm": 2e3, "max_layer_grad_norm": 2e3}
    assert finding.strength == pytest.approx(math.log10(2) / 3)
    assert "head" not in at


def test_clipping_is_undone_before_judging_and_reported():
    (found,) = observe_gradients([grad_step(0, {**HEALTHY, "head": 20.0}, clip=100.0)])
    assert found["head"].metrics == {
        "grad_norm": 2e3,
        "clipped_grad_norm": 20.0,
        "clip_factor": 100.0,
        "max_layer_grad_norm": 20.0,
    }
    assert found["head"].strength == pytest.approx(math.log10(2) / 3)
    assert set(found) == {"head"}  # the others, 0.3-0.5 received, 30-50 before clipping: healthy


def test_a_summed_loss_raises_the_threshold_by_its_smallest_loss_gradient_so_far():
    found = observe_gradients(
        [
            grad_step(0, {**HEALTHY, "head": 2e4}, target_grad=50.0),  # limit 5e4
            grad_step(1, {**HEALTHY, "head": 2e4}, target_grad=500.0),  # still 5e4: the smallest so far
            grad_step(2, {**HEALTHY, "head": 2e4}, target_grad=math.nan),  # ignored
            grad_step(3, {**HEALTHY, "head": 2e4}, target_grad=0.0),  # ignored
            grad_step(4, {**HEALTHY, "head": 2e4}, target_grad=10.0),  # limit 1e4: exploding
        ]
    )
    assert [f.get("head") is not None for f in found] == [False, False, False, False, True]
    assert found[4]["head"].metrics["loss_gradient_scale"] == 10.0
    assert found[4]["head"].strength == pytest.approx(math.log10(2) / 3)


def test_an_explosion_continues_provisionally_down_to_a_tenth_of_the_threshold():
    found = observe_gradients(
        [grad_step(s, {**HEALTHY, "head": n}) for s, n in enumerate([2e3, 500.0, 101.0, 99.0, 500.0])]
    )
    head = [f.get("head") for f in found]
    assert head[0] is not None and not head[0].provisional
    assert head[1] is not None and head[1].provisional and head[1].strength == 0.0
    assert head[2] is not None and head[2].provisional
    assert head[3] is None  # below a tenth: the explosion is over
    assert head[4] is None  # and a reading under the threshold does not start one


def test_a_non_finite_gradient_is_decisive():
    (found,) = observe_gradients([grad_step(0, {**HEALTHY, "head": math.nan})])
    finding = found["head"]
    assert (finding.kind, finding.state, finding.decisive, finding.strength) == (
        FailureKind.NON_FINITE,
        "non_finite",
        True,
        1.0,
    )
    assert finding.metrics["max_layer_grad_norm"] == 0.5  # the largest finite layer


def tracked_gradients(steps: list[StepData]) -> list[tuple[str, str, int, int, bool]]:
    """The events the tracker makes of what the gradient detectors find and observe over ``steps``, at the run's
    end: (layer, state, first step, last step, still holding)."""
    from neuraldbg.kinds.exploding_gradients import ExplodingDetector
    from neuraldbg.kinds.non_finite import NonFiniteGradientDetector
    from neuraldbg.kinds.vanishing_gradients import VanishingDetector

    detectors, ctx = [NonFiniteGradientDetector(), ExplodingDetector(), VanishingDetector()], grad_context()
    tracker = Tracker(DebugConfig(persistence_steps=1))
    for data in steps:
        view = StepView(data, ctx)
        seen = [(d.track_name, obs) for d in detectors if (obs := d.observe(view)) is not None]
        tracker.update(data.step, seen)
    return [
        (e.layer, str(e.to_state), e.step_start, e.step_end, "ongoing" in e.metrics) for e in tracker.events(final=True)
    ]


@pytest.mark.parametrize(
    ("norm", "state"), [(math.nan, "non_finite"), (1e4, "exploding"), (1e-12, "vanishing")], ids=str
)
def test_a_gradient_state_that_stops_holding_is_an_event_that_ended(norm: float, state: str):
    # every detector of a layer's gradient says which layers it looked at: a layer read healthy again ends its state
    healthy = {**HEALTHY, "embed": 0.5}
    steps = [grad_step(s, {**healthy, "embed": norm}) for s in range(4)] + [grad_step(s, healthy) for s in (4, 5)]
    assert tracked_gradients(steps) == [("embed", state, 0, 3, False)]
    assert tracked_gradients(steps[:4]) == [("embed", state, 0, 3, True)]  # not read healthy: still holding


def test_vanishing_needs_a_small_norm_and_a_small_ratio_unless_below_the_floor_or_exactly_zero():
    (found,) = observe_gradients(
        [grad_step(0, {"embed": 1e-5, "attn.query": 5e-4, "attn.key": 0.0, "attn.value": 1.0, "head": 1.0})]
    )
    embed = found["embed"]
    assert (embed.kind, embed.state) == (FailureKind.VANISHING_GRADIENTS, "vanishing")
    assert embed.metrics == {
        "grad_norm": 1e-5,
        "max_layer_grad_norm": 1.0,
        "ratio_to_max": 1e-5,
        "small_from_first_reading": 1.0,  # small at its first reading: undone if it grows out of it
    }
    assert embed.strength == pytest.approx(1 / 6)  # one decade below 1e-4, of six
    assert "attn.query" not in found  # 5e-4: above vanishing_norm
    zero = found["attn.key"]
    assert zero.metrics["exact_zero"] == 1.0 and zero.strength == 1.0

    (uniform,) = observe_gradients([grad_step(0, {name: 5e-5 for name in HEALTHY} | {"head": 1e-2})])
    assert uniform == {}  # 5e-5 is 5e-3 of the largest: uniformly small, not vanishing
    (floor,) = observe_gradients([grad_step(0, {name: 1e-10 for name in HEALTHY} | {"head": 1e-8})])
    assert set(floor) == {"embed", "attn.query", "attn.key", "attn.value"}  # below 1e-9 whatever the ratio


def test_an_exact_zero_between_tiny_readings_is_vanishing_and_between_healthy_ones_a_skipped_branch():
    """A gradient that underflows to exactly zero at some steps and is tiny at the others (query and key behind a
    saturated softmax) vanishes at every reading; one exactly zero at some steps and healthy at the others (a
    residual branch skipped for the whole batch) is skipped at its zero readings, which say nothing."""
    saturated = [1e-9, 0.0, 1e-9, 0.0]
    found = observe_gradients([grad_step(i, {**HEALTHY, "attn.query": g}) for i, g in enumerate(saturated)])
    assert [f["attn.query"].state for f in found] == ["vanishing"] * 4
    assert found[3]["attn.query"].metrics["exact_zero"] == 1.0
    skipped = [0.3, 0.0, 0.3, 0.0]
    found = observe_gradients([grad_step(i, {**HEALTHY, "attn.query": g}) for i, g in enumerate(skipped)])
    assert ["attn.query" in f for f in found] == [False, True, False, False]  # zero once before it read healthy


def test_a_gradient_small_since_its_first_reading_is_marked_so_until_it_reads_healthy():
    steps = [1e-5, 2e-5, 1e-2, 1e-5]
    found = observe_gradients([grad_step(i, {**HEALTHY, "embed": norm}) for i, norm in enumerate(steps)])
    assert [f["embed"].metrics.get("small_from_first_reading") for f in (found[0], found[1])] == [1.0, 1.0]
    assert "embed" not in found[2]  # grown out of it
    assert "small_from_first_reading" not in found[3]["embed"].metrics  # small again: a new stretch, not the start
    (later,) = observe_gradients([grad_step(0, HEALTHY), grad_step(1, {**HEALTHY, "embed": 1e-5})])[1:]
    assert "small_from_first_reading" not in later["embed"].metrics  # healthy at first


def test_a_gradient_small_only_after_clipping_is_not_vanishing():
    def clipped(before: float) -> StepData:
        data = grad_step(0, {**HEALTHY, "embed": 1e-5}, clip=50.0)
        data.grad_before_clip["embed.weight"] = before
        return data

    (kept,) = observe_gradients([clipped(0.3)])
    assert "embed" not in kept  # clipping left it small; the backward pass did not
    (still,) = observe_gradients([clipped(2e-5)])
    assert "embed" in still  # small before clipping too


def test_a_loss_with_almost_no_gradient_left_makes_no_layer_vanish():
    (found,) = observe_gradients([grad_step(0, {name: 1e-12 for name in HEALTHY}, target_grad=1e-7)])
    assert found == {}
    (still,) = observe_gradients([grad_step(0, {name: 1e-12 for name in HEALTHY}, target_grad=1e-5)])
    assert set(still) == set(HEALTHY)


def quiet_step(norms: dict[str, float], rms: dict[str, float]) -> StepData:
    data = grad_step(0, norms)
    for layer, value in rms.items():
        data.act[(layer, 0)] = value * 4  # norm of a 16-element output with this rms
        data.numel[(layer, 0)] = 16
    return data


def test_a_tiny_gradient_on_a_quiet_attention_projection_with_healthy_neighbours_is_not_vanishing():
    tiny = {**HEALTHY, "attn.query": 1e-6, "attn.key": 1e-6}
    quiet = {"attn.query": 0.1, "attn.key": 0.1}
    (found,) = observe_gradients([quiet_step(tiny, quiet)])
    assert found == {}  # the small-signal regime of attention at initialisation
    (loud,) = observe_gradients([quiet_step(tiny, {"attn.query": 3.0, "attn.key": 3.0})])
    assert set(loud) == {"attn.query", "attn.key"}  # large outputs: saturated logits, a real trap
    (cut_off,) = observe_gradients([quiet_step({**tiny, "attn.value": 1e-6}, {**quiet, "attn.value": 0.1})])
    assert set(cut_off) == {"attn.query", "attn.key", "attn.value"}  # the whole block: nothing healthy beside it
    (upstream,) = observe_gradients([quiet_step({**tiny, "embed": 1e-6}, {**quiet, "embed": 0.1})])
    assert {"attn.query", "attn.key"} <= set(upstream)  # nothing healthy before it: vanishing through depth
    (unmeasured,) = observe_gradients([quiet_step(tiny, {})])
    assert set(unmeasured) == {"attn.query", "attn.key"}  # no output reading proves nothing
    (floor,) = observe_gradients([quiet_step({**HEALTHY, "attn.query": 1e-10}, quiet)])
    assert set(floor) == {"attn.query"}  # below the floor, however quiet
