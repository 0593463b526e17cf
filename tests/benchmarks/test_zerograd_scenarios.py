"""The scenarios of a missing ``zero_grad()`` (``benchmarks/scenarios/zerograd.py`` and the held-out ones): the
plain-torch evidence proves the carried-over gradient exactly, sees none where gradients are cleared in any
legitimate way, and ``check()`` refuses the kind wherever it is not proved."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from benchmarks.evidence import Evidence, check, measure
from benchmarks.scenarios import get
from benchmarks.scenarios.holdout import SCENARIOS as HOLDOUT

FAULTY = ("zerograd_missing_mlp_sgd", "zerograd_missing_cnn_sgd_momentum")
HEALTHY = ("healthy_accumulate_then_grad_none_mlp", "healthy_tiny_readme")
NOT_ZEROED = frozenset({"gradients_not_zeroed"})


@functools.cache
def evidence_of(name: str) -> Evidence:
    return measure(get(name))


def _claiming(name: str, **changes: object):  # type: ignore[no-untyped-def]
    scenario = get(name)
    return dataclasses.replace(scenario, truth=dataclasses.replace(scenario.truth, **changes))


@pytest.mark.parametrize("name", FAULTY)
def test_every_parameter_carries_its_applied_gradient_from_step_one(name: str) -> None:
    ev = evidence_of(name)
    n_params = len(ev.param_grad_norm)
    assert ev.carried[0] == 0  # nothing was applied before the first backward pass
    assert ev.carried[1 : ev.horizon] == [n_params] * (ev.horizon - 1)


@pytest.mark.parametrize("name", HEALTHY)
def test_cleared_gradients_are_never_counted_as_carried(name: str) -> None:
    assert not any(evidence_of(name).carried)


@pytest.mark.parametrize("name", HEALTHY)
def test_check_refuses_the_kind_on_a_run_that_clears_its_gradients(name: str) -> None:
    problems = check(_claiming(name, kinds=NOT_ZEROED, onset=(1, 1)), evidence_of(name))
    assert any("no backward pass starts from the gradient" in p for p in problems)


@pytest.mark.parametrize("name", FAULTY)
def test_check_flags_the_carry_over_in_a_run_called_healthy(name: str) -> None:
    problems = check(_claiming(name, kinds=frozenset(), may_also=frozenset()), evidence_of(name))
    assert any("unexpected gradients_not_zeroed from step 1" in p for p in problems)


def test_check_rejects_a_wrong_onset_of_the_carry_over() -> None:
    name = FAULTY[0]
    problems = check(_claiming(name, onset=(5, 9)), evidence_of(name))
    assert any("outside (5, 9)" in p for p in problems)


def test_check_proves_the_harm_against_the_twin_with_zero_grad() -> None:
    """The scenario's own check trains the twin with zero_grad() in the loop: it must be healthy and better."""
    name = FAULTY[0]
    assert check(get(name), evidence_of(name)) == []
    twin = dataclasses.replace(get(name), build=lambda: dataclasses.replace(get(name).build(), loop=None))
    assert not any(measure(twin).carried)


def test_the_held_out_set_has_the_kind_on_two_model_classes() -> None:
    models = {type(s.build().model).__name__ for s in HOLDOUT if "gradients_not_zeroed" in s.truth.kinds}
    assert len(models) >= 2
