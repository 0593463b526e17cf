"""The scenario library builds deterministic runs, covers the failure vocabulary, and its ground truths agree
with what plain torch measures (``benchmarks.evidence``).

Every scenario is checked for form and determinism. Its ground truth is measured (a training run) in the default run
for the fast subset of the diagnosis benchmark (``benchmarks.diagnosis.FAST``: every failure kind and the hard
healthy runs) and for the scenarios the strictness tests below measure anyway; the others are marked ``benchmark``
and run with ``--benchmark`` (CI's benchmark job).
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from scenario_checks import assert_deterministic, assert_well_formed
from torch import nn

from benchmarks.diagnosis import FAST
from benchmarks.evidence import Evidence, check, inactive_units, measure, saturated_fraction
from benchmarks.scenarios import KINDS, SCENARIOS, get
from benchmarks.scenarios.base import GroundTruth, Scenario

SLOW = {
    "healthy_deep_residual_layernorm",
    "healthy_adam_lr_3e-5_wide",
    "healthy_transformer_encoder",
    "saturated_pooler_transformer",
}
#: Scenarios the strictness tests below measure: their ground truth is checked in the default run too.
STRICTNESS = {
    "dead_after_adam_lr_jump",
    "dead_bias_tiny",
    "dead_shared_act_bias",
    "exploding_bad_layer_init",
    "exploding_lr_too_high_mlp",
    "frozen_layer_left_out_of_optimizer",
    "healthy_finetune_frozen_backbone",
    "healthy_tiny_readme",
    "nonfinite_nan_batch_mlp",
    "nonfinite_sqrt_layer",
    "saturated_tanh_normal_init",
    "vanishing_gru_stuck_update_gate",
}
MEASURED_BY_DEFAULT = set(FAST) | STRICTNESS


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
def evidence_of(name: str) -> Evidence:
    """Measured once per session (on the one thread ``tests/conftest.py`` gives every test)."""
    return measure(get(name))


def with_truth(name: str, **changes: object) -> Scenario:
    scenario = get(name)
    return dataclasses.replace(scenario, truth=dataclasses.replace(scenario.truth, **changes))


# ------------------------------------------------------------------------------------------------ the library


def test_scenario_names_are_unique_and_get_finds_each() -> None:
    names = [s.name for s in SCENARIOS]
    assert len(names) == len(set(names))
    assert all(get(n) is s for n, s in zip(names, SCENARIOS, strict=True))
    with pytest.raises(KeyError, match="no scenario"):
        get("no_such_scenario")


def test_the_library_has_enough_scenarios_and_healthy_ones() -> None:
    assert len(SCENARIOS) >= 34
    assert sum(s.truth.healthy for s in SCENARIOS) >= 12


def test_every_failure_kind_appears_in_at_least_two_architectures() -> None:
    for kind in KINDS:
        archs = {s.arch for s in SCENARIOS if kind in s.truth.kinds}
        assert len(archs) >= 2, f"{kind} only in {archs}"


def test_faults_appear_both_from_step_zero_and_mid_run() -> None:
    onsets = [s.truth.onset for s in SCENARIOS if s.truth.onset is not None]
    assert any(lo == 0 for lo, _ in onsets)
    assert sum(lo > 0 for lo, _ in onsets) >= 6
    for kind in ("dead_neurons", "non_finite", "exploding_gradients"):
        starts = {s.truth.onset[0] > 0 for s in SCENARIOS if kind in s.truth.kinds and s.truth.onset}
        assert starts == {False, True}, kind


def test_the_slow_marks_name_real_scenarios() -> None:
    assert {s.name for s in SCENARIOS} >= SLOW


def test_the_default_run_measures_real_scenarios_of_every_kind() -> None:
    assert {s.name for s in SCENARIOS} >= MEASURED_BY_DEFAULT
    assert set().union(*(get(name).truth.kinds for name in MEASURED_BY_DEFAULT)) == set(KINDS)


@pytest.mark.parametrize("scenario", _params(SCENARIOS))
def test_ground_truth_is_well_formed(scenario: Scenario) -> None:
    assert_well_formed(scenario)


@pytest.mark.parametrize("scenario", _params(SCENARIOS))
def test_build_is_deterministic(scenario: Scenario) -> None:
    assert_deterministic(scenario)


@pytest.mark.parametrize("scenario", _params(SCENARIOS, trains=True))
def test_ground_truth_agrees_with_the_evidence(scenario: Scenario) -> None:
    assert check(scenario, evidence_of(scenario.name)) == []


# ----------------------------------------------------------------------------------------- check() is strict


def test_check_rejects_calling_a_dead_run_healthy() -> None:
    scenario = dataclasses.replace(get("dead_bias_tiny"), truth=GroundTruth())
    assert any("dead_neurons" in p for p in check(scenario, evidence_of("dead_bias_tiny")))


def test_check_rejects_a_fault_the_run_does_not_show() -> None:
    scenario = with_truth("healthy_tiny_readme", kinds=frozenset({"exploding_gradients"}))
    assert any("never above" in p for p in check(scenario, evidence_of("healthy_tiny_readme")))


def test_check_rejects_a_wrong_root_layer() -> None:
    scenario = with_truth("nonfinite_sqrt_layer", root_layers=frozenset({"0"}))
    assert any("not in ['0']" in p for p in check(scenario, evidence_of("nonfinite_sqrt_layer")))


@pytest.mark.parametrize(
    ("name", "wrong_root"),
    [
        ("saturated_tanh_normal_init", "3"),  # the second tanh is saturated too, but later in forward order
        ("vanishing_gru_stuck_update_gate", "head"),
        ("exploding_bad_layer_init", "2"),
        ("dead_shared_act_bias", "fc1"),
    ],
)
def test_check_rejects_a_victim_named_as_root(name: str, wrong_root: str) -> None:
    assert check(with_truth(name, root_layers=frozenset({wrong_root})), evidence_of(name))


def test_check_rejects_the_victims_of_a_poisoned_batch_as_root() -> None:
    scenario = with_truth("nonfinite_nan_batch_mlp", root_layers=frozenset({"0"}))
    assert check(scenario, evidence_of("nonfinite_nan_batch_mlp"))


def test_check_rejects_a_wrong_onset() -> None:
    scenario = with_truth("dead_after_adam_lr_jump", onset=(0, 10))
    assert any("outside (0, 10)" in p for p in check(scenario, evidence_of("dead_after_adam_lr_jump")))


def test_check_rejects_undeclared_side_effects() -> None:
    scenario = with_truth("exploding_lr_too_high_mlp", may_also=frozenset())
    problems = check(scenario, evidence_of("exploding_lr_too_high_mlp"))
    assert any("unexpected non_finite" in p for p in problems)
    assert any("unexpected dead_neurons" in p for p in problems)


def test_check_rejects_a_frozen_root_that_is_updated() -> None:
    scenario = with_truth("frozen_layer_left_out_of_optimizer", root_layers=frozenset({"fc1"}))
    assert any("'fc1' is updated" in p for p in check(scenario, evidence_of("frozen_layer_left_out_of_optimizer")))


def test_check_does_not_count_a_backbone_frozen_on_purpose() -> None:
    ev = evidence_of("healthy_finetune_frozen_backbone")
    assert "backbone.0" in ev.frozen_by_design
    assert check(get("healthy_finetune_frozen_backbone"), ev) == []


# ------------------------------------------------------------------------------------- measuring definitions


def test_a_unit_is_dead_only_when_inactive_on_every_sample() -> None:
    out = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]])  # unit 0 never fires; units 1 and 2 fire once
    assert inactive_units(out).tolist() == [True, False, False]
    maps = torch.zeros(2, 2, 3, 3)
    maps[1, 1, 2, 2] = 0.5  # channel 1 fires at one position of one sample
    assert inactive_units(maps).tolist() == [True, False]


def test_saturation_counts_only_bounded_activations() -> None:
    y = torch.tensor([0.999, -0.999, 0.5, 0.0])
    assert saturated_fraction(nn.Tanh(), y) == pytest.approx(0.5)
    assert saturated_fraction(nn.Sigmoid(), torch.tensor([0.001, 0.5, 0.9999, 0.3])) == pytest.approx(0.5)
    assert saturated_fraction(nn.Linear(1, 1), y) is None
