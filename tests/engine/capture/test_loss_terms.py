"""A step's loss that adds up fewer backward passes than most steps do is partial (gradient accumulation's last
micro-batches of an epoch) and stays out of the loss trace. The most frequent count of passes is followed as the
counts grow; it must be what a look over all the counts at every step gives, ties going to the larger count of
passes."""

from __future__ import annotations

import random
from collections import Counter

from neuraldbg.capture.coverage import PARTIAL_AFTER, Coverage


def reference(counts: Counter[int], terms: int) -> bool:
    usual = max(counts, key=lambda k: (counts[k], k), default=terms)
    return usual > 1 and terms < usual and counts[usual] >= PARTIAL_AFTER


def test_the_followed_count_agrees_with_a_look_over_all_counts():
    rng = random.Random(0)
    verdicts = Counter()
    for _ in range(60):
        coverage, counts = Coverage(), Counter()
        weights = [rng.random() for _ in range(4)]
        weights[rng.randrange(1, 4)] += 2  # most runs accumulate: one count of passes is the usual one
        for _ in range(rng.randint(1, 6 * PARTIAL_AFTER)):
            terms = rng.choices([1, 2, 3, 4], weights)[0]
            expected = reference(counts, terms)
            assert coverage.partial_loss(terms) == expected, (counts, terms)
            verdicts[expected] += 1
            coverage._count_terms(terms)
            counts[terms] += 1
        assert coverage.loss_term_counts == dict(counts)
    assert verdicts[True] > 50 and verdicts[False] > 50


def test_ties_go_to_the_larger_count_of_passes():
    coverage = Coverage()
    for terms in [4] * PARTIAL_AFTER + [2] * PARTIAL_AFTER:
        coverage._count_terms(terms)
    assert coverage.partial_loss(3)  # 4 and 2 equally frequent: 4 is the usual count, 3 falls short of it
    assert coverage.partial_loss(1)
    coverage._count_terms(2)
    assert not coverage.partial_loss(3)  # 2 is now the most frequent: 3 passes hold more than it


def test_nothing_is_partial_before_the_usual_count_has_held():
    coverage = Coverage()
    for _ in range(PARTIAL_AFTER - 1):
        coverage._count_terms(4)
    assert not coverage.partial_loss(1)
    coverage._count_terms(4)
    assert coverage.partial_loss(1)
    assert not coverage.partial_loss(4)
    assert not Coverage().partial_loss(1)  # no counts yet
