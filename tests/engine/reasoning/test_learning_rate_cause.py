"""The learning rate as the fault: units dying or saturating, or gradients vanishing, long after updates as large as
the weights came and went at the learning rate still in force are that learning rate's doing (an
``oversized_updates`` hypothesis rooted at the first surge); a failure a surge set off right away keeps its own kind
and names the learning rate; a failure present from the first step, one that came before any surge, one at another
learning rate, and an explosion stay what they are. Events written by hand: what the reasoning does with them,
nothing else."""

from __future__ import annotations

import pytest

from neuraldbg import EventType, FailureKind, SemanticEvent
from neuraldbg.reasoning import Topology, builtin_rules, diagnose

D, S, E = FailureKind.DEAD_NEURONS, FailureKind.SATURATED_ACTIVATIONS, FailureKind.EXPLODING_GRADIENTS
OU = FailureKind.OVERSIZED_UPDATES
TOPO = Topology(
    order=["0", "1", "2", "3", "4"], types={}, roles={"0": "parametric", "2": "parametric", "4": "parametric"}
)


def surge(start: int, end: int, lr: float = 0.1) -> SemanticEvent:
    metrics = {"median_update_ratio": 0.4, "lr": lr, "loss_before": 2.3, "loss_during": 15.8}
    return SemanticEvent(EventType.UPDATE, None, "", None, start, end, None, "exploding", metrics, 0.75)


def dead(start: int, layer: str = "3") -> SemanticEvent:
    metrics = {"dead_fraction": 0.78, "dead_units": 50.0, "units": 64.0}
    return SemanticEvent(EventType.ACTIVATION, D, layer, None, start, 95, None, "dead", metrics, 0.74)


def saturated(start: int) -> SemanticEvent:
    metrics = {"saturated_fraction": 1.0, "elements": 2048.0}
    return SemanticEvent(EventType.ACTIVATION, S, "3", None, start, 95, None, "saturated", metrics, 0.9)


def vanishing(start: int) -> SemanticEvent:
    metrics = {"grad_norm": 2e-6, "max_layer_grad_norm": 0.5, "ratio_to_max": 4e-6}
    return SemanticEvent(
        EventType.GRADIENT, FailureKind.VANISHING_GRADIENTS, "2", None, start, 95, None, "vanishing", metrics, 0.8
    )


def exploding(start: int) -> SemanticEvent:
    return SemanticEvent(EventType.GRADIENT, E, "2", None, start, 95, None, "exploding", {"grad_norm": 5e4}, 0.9)


def lr_history(rate: float):
    return lambda metric, layer: [(0, rate), (48, rate)] if metric == "lr" else []


@pytest.mark.parametrize("failure", [dead, saturated, vanishing], ids=["dead", "saturated", "vanishing"])
def test_a_failure_long_after_the_surges_at_its_learning_rate_is_that_learning_rates_fault(failure):
    first, late = surge(0, 7), failure(48)
    (h,) = diagnose([late, first], TOPO, builtin_rules(), lr_history(0.1))
    assert h.kind is OU and h.root is first
    assert h.chain == [first, late]
    assert [(c.cause, c.relation, c.effect) for c in h.couplings] == [(first, "set off", late)]
    assert "Oversized updates from step 0 with learning rate 0.1" in h.explanation
    assert "the loss rose from 2.3 to 15.8" in h.explanation
    assert "(from step 48)" in h.explanation
    assert h.suggestion.startswith("lower the learning rate (now 0.1)")
    assert "initialisation" not in h.explanation


def test_every_surge_at_that_learning_rate_joins_it_and_the_first_is_the_root():
    events = [dead(48), surge(30, 31), surge(0, 7)]
    (h,) = diagnose(events, TOPO, builtin_rules(), lr_history(0.1))
    assert h.kind is OU and h.root is events[2]
    assert events[0] in h.chain and events[1] in h.chain


def test_a_failure_a_surge_set_off_keeps_its_kind_and_names_the_learning_rate():
    trigger, death = surge(40, 44), dead(48)
    (h,) = diagnose([death, trigger], TOPO, builtin_rules(), lr_history(0.1))
    assert h.kind is D and h.root is death
    assert "It started right after oversized updates" in h.explanation
    assert "the learning rate is too high" in h.explanation


def test_a_failure_before_any_surge_stays_its_own_root():
    death, later = dead(48), surge(60, 62)
    hypotheses = diagnose([death, later], TOPO, builtin_rules(), lr_history(0.1))
    assert hypotheses[0].kind is D and hypotheses[0].root is death


def test_a_failure_present_from_the_first_step_was_there_before_any_update():
    death, first = dead(0), surge(0, 7)
    hypotheses = diagnose([death, first], TOPO, builtin_rules(), lr_history(0.1))
    assert {(h.kind, id(h.root)) for h in hypotheses} == {(D, id(death)), (OU, id(first))}


def test_a_failure_at_another_learning_rate_is_another_fault():
    death, first = dead(48), surge(0, 7, lr=0.1)
    hypotheses = diagnose([death, first], TOPO, builtin_rules(), lr_history(0.001))
    assert {(h.kind, id(h.root)) for h in hypotheses} == {(D, id(death)), (OU, id(first))}


def test_an_explosion_long_after_the_surges_stays_an_explosion():
    blowup, first = exploding(48), surge(0, 7)
    hypotheses = diagnose([blowup, first], TOPO, builtin_rules(), lr_history(0.1))
    assert hypotheses[0].kind is E and hypotheses[0].root is blowup


def test_only_exploding_gradients_read_as_large_gradients_in_the_learning_rates_explanation():
    vanishing = SemanticEvent(EventType.GRADIENT, FailureKind.VANISHING_GRADIENTS, "0", None, 48, 95, None, "vanishing")
    (h,) = diagnose([surge(0, 7), dead(48), vanishing], TOPO, builtin_rules(), lr_history(0.1))
    assert h.kind is OU and vanishing in h.chain
    assert "Gradients are large too" not in h.explanation


# --- the loss it spoilt ---------------------------------------------------------------------------------------


def loss_finding(kind: FailureKind = FailureKind.UNSTABLE_LOSS, start: int = 0) -> SemanticEvent:
    from neuraldbg.kinds.base import run_event

    return run_event(kind, start, 95, "", start=4.9, end=1.9, noise=2.1, losses=96.0, shape=3.0)


@pytest.mark.parametrize(
    "kind", [FailureKind.UNSTABLE_LOSS, FailureKind.LOSS_AT_CHANCE, FailureKind.LOSS_NOT_DECREASING]
)
def test_a_loss_finding_that_began_with_the_surges_is_the_learning_rates_doing(kind):
    first, loss, again = surge(0, 7), loss_finding(kind), surge(30, 33)
    (h,) = diagnose([loss, again, first], TOPO, builtin_rules())
    assert h.kind is OU and h.root is first
    assert loss in h.chain and again in h.chain
    assert [(c.cause, c.relation, c.effect) for c in h.couplings] == [(first, "keeps the loss from falling", loss)]
    assert h.suggestion.startswith("lower the learning rate (now 0.1)")


def test_a_loss_finding_that_began_before_any_surge_stays_its_own_root():
    loss, late = loss_finding(start=0), surge(60, 64)
    hypotheses = diagnose([loss, late], TOPO, builtin_rules())
    assert hypotheses[0].kind is FailureKind.UNSTABLE_LOSS and hypotheses[0].root is loss
