"""How the loss findings relate to the faults of the run: a fault that began before a loss finding explains it (the
loss is how the fault shows), and zero gradients that began in mid-run, after every first reading was non-zero,
are the doing of a fault that came before them."""

from __future__ import annotations

from neuraldbg import EventType, FailureKind, SemanticEvent
from neuraldbg.kinds.base import run_event
from neuraldbg.reasoning import Topology, builtin_rules, diagnose

TOPO = Topology(order=["0", "1", "2"], types={}, roles={"0": "parametric", "2": "parametric"}, last_step=99)


def dead_layer(start: int) -> SemanticEvent:
    return SemanticEvent(
        EventType.ACTIVATION, FailureKind.DEAD_NEURONS, "1", None, start, 99, None, "dead", {"dead_fraction": 1.0}, 0.9
    )


def test_gradients_not_zeroed_explain_the_unstable_loss_they_came_before():
    cause = run_event(FailureKind.GRADIENTS_NOT_ZEROED, 1, 99, "0.weight", steps=98.0, parameters=2.0)
    loss = run_event(FailureKind.UNSTABLE_LOSS, 0, 99, "", start=1.0, end=2.0, noise=0.1, losses=100.0)
    hypotheses = diagnose([loss, cause], TOPO, builtin_rules())
    assert [h.kind for h in hypotheses] == [FailureKind.GRADIENTS_NOT_ZEROED]
    assert loss in hypotheses[0].chain


def test_a_loss_finding_with_no_fault_before_it_is_its_own_hypothesis():
    loss = run_event(FailureKind.LOSS_AT_CHANCE, 0, 60, "", start=2.3, end=2.3, noise=0.05, losses=61.0)
    later = dead_layer(80)  # began after the loss finding ended: not why the loss stayed at chance
    kinds = [h.kind for h in diagnose([loss, later], TOPO, builtin_rules())]
    assert sorted(k.value for k in kinds) == ["dead_neurons", "loss_at_chance"]


def test_zero_gradients_that_began_in_mid_run_are_the_doing_of_the_fault_before_them():
    dead = dead_layer(5)
    zero = run_event(FailureKind.DEGENERATE_LOSS, 20, 99, "", steps=100.0, zero_steps=80.0, early_zero=0.0)
    hypotheses = diagnose([zero, dead], TOPO, builtin_rules())
    assert hypotheses[0].kind is FailureKind.DEAD_NEURONS
    assert zero in hypotheses[0].chain


def test_zero_gradients_from_the_first_readings_come_first():
    dead = dead_layer(5)
    zero = run_event(FailureKind.DEGENERATE_LOSS, 3, 99, "", steps=100.0, zero_steps=97.0, early_zero=8.0)
    hypotheses = diagnose([zero, dead], TOPO, builtin_rules())
    assert hypotheses[0].kind is FailureKind.DEGENERATE_LOSS


def test_a_loss_finding_a_fault_explains_is_said_to_hold_over_the_run_not_from_its_first_step():
    """A loss finding judges the whole curve: its first step is the run's, not when the loss went wrong, so a fault
    that began at step 40 is not said to have caused something 'from step 0'; other effects keep their step."""
    dead = dead_layer(40)
    loss = run_event(FailureKind.LOSS_AT_CHANCE, 0, 99, "", start=2.3, end=2.3, noise=0.05, losses=100.0)
    vanishing = SemanticEvent(
        EventType.GRADIENT, FailureKind.VANISHING_GRADIENTS, "0", None, 41, 99, None, "vanishing", {}, 0.8
    )
    hypotheses = diagnose([loss, dead, vanishing], TOPO, builtin_rules())
    assert hypotheses[0].kind is FailureKind.DEAD_NEURONS and loss in hypotheses[0].chain
    text = hypotheses[0].explanation
    assert "in the model (over the run)" in text and "(from step 0)" not in text, text
    assert "(from step 41)" in text, text


def test_a_shared_layers_second_call_dying_too_is_not_said_to_be_caused_by_its_first():
    """A siamese net's shared embedding dies on both calls: one fault, not the first call's effect on the second."""
    first = dead_layer(40)
    second = SemanticEvent(
        EventType.ACTIVATION,
        FailureKind.DEAD_NEURONS,
        "1",
        None,
        44,
        99,
        None,
        "dead",
        {"dead_fraction": 1.0, "call": 1.0},
        0.9,
    )
    hypotheses = diagnose([first, second], TOPO, builtin_rules())
    assert hypotheses[0].kind is FailureKind.DEAD_NEURONS and second in hypotheses[0].chain
    assert "caused dead units in '1'" not in hypotheses[0].explanation, hypotheses[0].explanation
