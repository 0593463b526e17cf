"""The held-out scenario set (``benchmarks/scenarios/holdout.py``) builds deterministic runs, covers the failure
vocabulary, and its ground truths agree with what plain torch measures (``benchmarks.holdout_evidence``).

Every scenario is checked for form and determinism. Its ground truth is measured (training runs) in the default run
for the scenarios the strictness tests below measure anyway; the others are marked ``benchmark`` and run with
``--benchmark`` (CI's benchmark job).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter

import pytest
from scenario_checks import assert_deterministic, assert_well_formed

from benchmarks.evidence import check
from benchmarks.holdout_evidence import EXTRAS, FUNCTIONAL, Measured, evaluate, measure_holdout
from benchmarks.scenarios import SCENARIOS as CALIBRATION
from benchmarks.scenarios.base import KINDS, GroundTruth, Scenario
from benchmarks.scenarios.holdout import SCENARIOS

BY_NAME = {s.name: s for s in SCENARIOS}
SLOW = {  # more than ~0.5 s to measure on one thread
    "holdout_dead_vgg_negative_bias_block",
    "holdout_saturated_se_gate_temperature",
    "holdout_exploding_steplr_gamma_10_vgg",
    "holdout_stalled_loss_over_dataset_size",
    "holdout_exploding_grads_never_zeroed_unet",
    "holdout_healthy_zero_init_residual",
    "holdout_healthy_vgg_bn_eval_passes",
    "holdout_healthy_onecycle_warmup_separable",
    "holdout_healthy_unet_denoiser_adamw",
}
#: Scenarios the strictness tests below measure: their ground truth is checked in the default run too.
MEASURED_BY_DEFAULT = {
    "holdout_dead_multitask_trunk_rmsprop",
    "holdout_dead_siamese_lr_jump",
    "holdout_exploding_grads_never_zeroed_unet",
    "holdout_exploding_gru_lm_clipped",
    "holdout_frozen_block_unfrozen_after_optimizer",
    "holdout_grads_zeroed_per_epoch_gru",
    "holdout_nonfinite_nan_regression_labels",
    "holdout_nonfinite_silent_clip_rms_norm",
    "holdout_saturated_tanh_raw_pcm_conv1d",
    "holdout_stalled_gan_generator_exponential_lr",
}


def _params(scenarios: list[Scenario], *, trains: bool = False) -> list[object]:
    """One param per scenario; with ``trains``, those outside the default run's set are marked ``benchmark``."""
    params = []
    for s in scenarios:
        marks = [pytest.mark.slow] if s.name in SLOW else []
        if trains and s.name not in MEASURED_BY_DEFAULT:
            marks.append(pytest.mark.benchmark)
        params.append(pytest.param(s, id=s.name, marks=marks))
    return params


@functools.cache
def measured(name: str) -> Measured:
    """Measured once per session (on the one thread ``tests/conftest.py`` gives every test)."""
    return measure_holdout(BY_NAME[name])


def problems_of(scenario: Scenario) -> list[str]:
    """Contradictions between the scenario's truth and its evidence, including the control runs' evidence."""
    return evaluate(scenario, measured(scenario.name))[1]


def with_truth(name: str, **changes: object) -> Scenario:
    scenario = BY_NAME[name]
    return dataclasses.replace(scenario, truth=dataclasses.replace(scenario.truth, **changes))


# ------------------------------------------------------------------------------------------------ the set


def test_names_are_unique_prefixed_and_unseen_in_calibration() -> None:
    names = [s.name for s in SCENARIOS]
    assert len(names) == len(set(names))
    assert all(n.startswith("holdout_") for n in names)
    calibration = {s.name for s in CALIBRATION if not s.name.startswith("holdout_")}
    assert not set(names) & calibration


def test_the_set_is_large_enough_with_enough_healthy_runs() -> None:
    assert len(SCENARIOS) >= 24
    assert sum(s.truth.healthy for s in SCENARIOS) >= 10


def test_every_kind_is_covered_twice_by_different_models() -> None:
    counts = Counter(kind for s in SCENARIOS for kind in s.truth.kinds)
    assert set(counts) == KINDS
    for kind in KINDS:
        assert counts[kind] >= 2, kind
        models = {type(s.build().model).__name__ for s in SCENARIOS if kind in s.truth.kinds}
        assert len(models) >= 2, f"{kind} only in {models}"


def test_faults_start_both_at_step_zero_and_mid_run() -> None:
    onsets = [s.truth.onset for s in SCENARIOS if s.truth.onset is not None]
    assert any(lo == 0 for lo, _ in onsets)
    assert sum(lo >= 10 for lo, _ in onsets) >= 3


def test_the_slow_marks_and_evidence_tables_name_real_scenarios() -> None:
    assert set(BY_NAME) >= SLOW | set(EXTRAS) | set(FUNCTIONAL) | MEASURED_BY_DEFAULT


@pytest.mark.parametrize("scenario", _params(SCENARIOS))
def test_ground_truth_is_well_formed(scenario: Scenario) -> None:
    assert_well_formed(scenario)
    assert scenario.truth.evidence


@pytest.mark.parametrize("scenario", _params(SCENARIOS))
def test_build_is_deterministic(scenario: Scenario) -> None:
    assert_deterministic(scenario)


@pytest.mark.parametrize("scenario", _params(SCENARIOS, trains=True))
def test_ground_truth_agrees_with_the_evidence(scenario: Scenario) -> None:
    assert problems_of(scenario) == []


# ----------------------------------------------------------------------------------- the evidence is strict


def test_a_healthy_truth_is_rejected_for_a_faulty_run() -> None:
    name = "holdout_dead_multitask_trunk_rmsprop"
    scenario = dataclasses.replace(BY_NAME[name], truth=GroundTruth())
    assert any("dead_neurons" in p for p in check(scenario, measured(name).ev))


@pytest.mark.parametrize(
    ("name", "wrong_root"),
    [
        ("holdout_nonfinite_silent_clip_rms_norm", "conv1"),  # the first victim, not the layer that divides by 0
        ("holdout_nonfinite_nan_regression_labels", "reg_head"),  # every layer output is finite
        ("holdout_exploding_gru_lm_clipped", "decoder"),  # the GRU, not the layer with the largest gradient
        ("holdout_frozen_block_unfrozen_after_optimizer", "head"),  # the head is updated
        ("holdout_saturated_tanh_raw_pcm_conv1d", "act2"),
        ("holdout_dead_multitask_trunk_rmsprop", "trunk.1"),
    ],
)
def test_a_wrong_root_is_rejected(name: str, wrong_root: str) -> None:
    assert check(with_truth(name, root_layers=frozenset({wrong_root})), measured(name).ev)


@pytest.mark.parametrize(
    ("name", "wrong_onset"),
    [
        ("holdout_nonfinite_nan_regression_labels", (0, 5)),
        ("holdout_dead_siamese_lr_jump", (0, 29)),
        ("holdout_stalled_gan_generator_exponential_lr", (10, 20)),
    ],
)
def test_a_wrong_onset_is_rejected(name: str, wrong_onset: tuple[int, int]) -> None:
    assert check(with_truth(name, onset=wrong_onset), measured(name).ev)


def test_undeclared_side_effects_are_rejected() -> None:
    name = "holdout_exploding_grads_never_zeroed_unet"
    problems = check(with_truth(name, may_also=frozenset()), measured(name).ev)
    assert any("unexpected non_finite" in p for p in problems)
    assert any("unexpected dead_neurons" in p for p in problems)
