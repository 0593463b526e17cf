"""Assertion helpers on real runs and on hand-made histories."""

from __future__ import annotations

import pytest
import support
import torch
import torch.nn.functional as F

from neuraldbg import FailureKind
from neuraldbg.queries import Queries
from neuraldbg.reasoning import Topology
from neuraldbg.stats.history import History
from pytest_neuraldbg import assertions
from pytest_neuraldbg.fixture import NeuralDbgFixture
from pytest_neuraldbg.options import Settings


@pytest.fixture(scope="module")
def dead():
    torch.manual_seed(0)
    model = support.mlp(width=16, depth=2)
    with torch.no_grad():
        model[2].bias.fill_(-20.0)
    return NeuralDbgFixture(Settings()).smoke_train(model, support.regression_batches(), F.mse_loss, steps=30)


def test_the_message_starts_with_one_verdict_line_and_names_layer_and_step(dead) -> None:
    with pytest.raises(AssertionError) as info:
        assertions.assert_healthy(dead)
    first, blank, explanation, *chain = str(info.value).splitlines()
    assert first == "NeuralDBG: training is unhealthy - dead_neurons at '3' from step 0 (confidence 1.00)"
    assert blank == "" and explanation.startswith("Dead neurons in '3' (ReLU)")
    assert chain[0] == "Causal chain (root first):" and chain[1].startswith("  root '3': 100% of")


def test_ignore_takes_failure_kinds_or_their_names_and_rejects_unknown_ones(dead) -> None:
    assertions.assert_healthy(dead, ignore=[FailureKind.DEAD_NEURONS])
    assertions.assert_healthy(dead, ignore=["DEAD_NEURONS"])
    with pytest.raises(
        ValueError,
        match=r"assert_healthy\(ignore=...\): unknown failure kind 'dead' \(did you mean 'dead_neurons'\?\); "
        r"expected one of",
    ):
        assertions.assert_healthy(dead, ignore=["dead"])
    with pytest.raises(
        ValueError, match=r"unknown failure kind 'exploding_gradient' \(did you mean 'exploding_gradients'\?\)"
    ):
        assertions.assert_healthy(dead, ignore=["exploding_gradient"])


def test_helpers_refuse_what_is_not_a_debugger() -> None:
    with pytest.raises(TypeError, match=r"assert_finite\(\): expected a NeuralDbg debugger or a trace .* got list"):
        assertions.assert_finite([])


def test_helpers_work_on_a_trace_loaded_from_disk(dead, tmp_path) -> None:
    from neuraldbg import load

    trace = load(dead.save(tmp_path / "t.json"))
    with pytest.raises(AssertionError, match=r"^NeuralDBG: dead neurons - dead_neurons at '3' from step 0"):
        assertions.assert_no_dead_neurons(trace)
    assertions.assert_no_exploding_gradients(trace)


class FakeRun(Queries):
    """A run with no events, a dead-fraction history and a persistence (the engine judges max_fraction over it)."""

    def __init__(self, points: list[float], persistence: int = 3) -> None:
        self.history = History(64)
        for step, value in enumerate(points):
            self.history.add("dead_fraction", "act", step, value)
        self.config = {"persistence": persistence}

    def _current(self) -> tuple[list, Topology, list]:
        return [], Topology(order=["act"], types={"act": "ReLU"}, roles={"act": "gated"}), []

    def _meta(self) -> dict:
        return {"config": self.config}


def test_max_fraction_fails_a_layer_above_it_for_persistence_consecutive_steps() -> None:
    run = FakeRun([0.1, 0.3, 0.35, 0.4, 0.1, 0.3])
    assertions.assert_no_dead_neurons(run)  # the engine found nothing: passes by default
    assertions.assert_no_dead_neurons(run, max_fraction=0.35)  # above 0.35 only once
    with pytest.raises(AssertionError) as info:
        assertions.assert_no_dead_neurons(run, max_fraction=0.2)
    assert str(info.value).splitlines()[0] == (
        "NeuralDBG: dead neurons - dead_neurons at 'act' from step 1 (above max_fraction 0.2)"
    )
    assert "Up to 40% of the units of 'act' were inactive on every sample over steps 1-3" in str(info.value)
    assertions.assert_no_dead_neurons(FakeRun([0.3, 0.3, 0.1], persistence=3), max_fraction=0.2)


@pytest.mark.parametrize("bad", [-0.1, 1.0, "0.5"])
def test_max_fraction_must_be_a_fraction(bad: object) -> None:
    with pytest.raises(ValueError, match=r"max_fraction=...\): expected a number in \[0, 1\)"):
        assertions.assert_no_dead_neurons(FakeRun([]), max_fraction=bad)


def _exploding() -> dict:
    torch.manual_seed(0)
    return {"model": support.mlp(width=16, depth=2), "optimizer": lambda p: torch.optim.SGD(p, lr=5.0)}


def _saturated() -> dict:
    torch.manual_seed(0)
    model = support.mlp(width=16, depth=2, act=torch.nn.Tanh)
    with torch.no_grad():
        model[0].weight.mul_(30)
    return {"model": model}


def _frozen() -> dict:
    torch.manual_seed(0)
    model = support.mlp(width=16, depth=2)
    return {"model": model, "optimizer": torch.optim.Adam([*model[2].parameters(), *model[4].parameters()])}


def _stalled() -> dict:
    torch.manual_seed(0)
    return {"model": support.mlp(width=16, depth=2), "optimizer": lambda p: torch.optim.SGD(p, lr=1e-9)}


@pytest.mark.parametrize(
    ("make", "helper", "first_line"),
    [
        (_exploding, assertions.assert_no_exploding_gradients, "NeuralDBG: exploding gradients - exploding_gradients"),
        (_exploding, assertions.assert_finite, "NeuralDBG: non-finite values in "),
        (_saturated, assertions.assert_no_saturation, "NeuralDBG: saturated activations - saturated_activations"),
        (_frozen, assertions.assert_parameters_update, "NeuralDBG: parameters do not update - frozen_parameters"),
        (_stalled, assertions.assert_parameters_update, "NeuralDBG: parameters do not update - stalled_updates"),
    ],
    ids=["exploding", "non-finite", "saturated", "frozen", "stalled"],
)
def test_each_helper_fails_on_the_fault_it_names(make, helper, first_line: str) -> None:
    run = make()
    ndbg = NeuralDbgFixture(Settings()).smoke_train(
        run["model"], support.regression_batches(), F.mse_loss, steps=30, optimizer=run.get("optimizer")
    )
    with pytest.raises(AssertionError) as info:
        helper(ndbg)
    assert str(info.value).splitlines()[0].startswith(first_line)


def test_a_helper_that_raises_on_a_watched_run_marks_those_failures_as_asserted() -> None:
    from pytest_neuraldbg import assert_healthy, assert_no_dead_neurons, assert_no_exploding_gradients, records

    model = support.mlp(width=16, depth=2)
    with torch.no_grad():
        model[2].bias.fill_(-20.0)
    ndbg = NeuralDbgFixture(Settings()).smoke_train(model, support.regression_batches(), F.mse_loss, steps=20)
    assert_no_exploding_gradients(ndbg)  # passes: marks nothing
    assert_healthy(ndbg, ignore=["dead_neurons"])
    assert ndbg.asserted == set()
    with pytest.raises(AssertionError):
        assert_no_dead_neurons(ndbg)
    assert ndbg.asserted == {("dead_neurons", "3", 0)}
    rec = records.summarise(ndbg, nodeid="t::x", run="1")
    assert [h["asserted"] for h in rec["hypotheses"]] == [True]
