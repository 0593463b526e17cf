"""The likely causes of a loss at chance, ranked from the run's numbers: a loss that had fallen well below chance
and rose back to it was undone by its training (a learning rate, or a warm-up's peak, too high), not given labels
that never matched; one that started at chance and stayed keeps labels first."""

from __future__ import annotations

import math

from neuraldbg.kinds.loss_evidence import causes

CHANCE = math.log(4)


def metrics(start: float) -> dict[str, float]:
    return {"start": start, "end": 1.33, "chance": CHANCE, "classes": 4.0, "band": 0.05, "classifier": 1.0}


def test_a_loss_that_fell_below_chance_and_rose_back_is_the_learning_rates():
    found = causes(metrics(start=0.877), "chance")
    assert found[0].name == "learning rate too high" and "rose back" in found[0].evidence


def test_a_loss_at_chance_from_its_start_keeps_the_labels_first():
    assert causes(metrics(start=1.40), "chance")[0].name == "labels that do not match the inputs"
    # within two widths of the band below chance: a first stretch that began to learn is not yet evidence
    assert causes(metrics(start=0.92 * CHANCE), "chance")[0].name == "labels that do not match the inputs"
