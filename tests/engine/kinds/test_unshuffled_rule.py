"""``UnshuffledData.run_finding`` on the label readings a run files (step, its top class, that class's share): a
step's purity and the chance of keeping a class are read on the observed steps as they are, the class that tops
the run by the steps each observed one stands for. The readings below are the real-programs benchmark's
``mlp.sorted_unshuffled`` (2,048 images sorted by 10 classes, batches of 64: 3.2 steps a class, 80 steps): every
step observed until 16, then every 16th, two of the four sparse readings straddling two blocks."""

from __future__ import annotations

from neuraldbg.capture.coverage import Coverage, RunFacts
from neuraldbg.events import FailureKind
from neuraldbg.kinds.unshuffled_data import STEP_SHARE, UnshuffledData, stretches

FACTS = RunFacts(trainable=4, backward_passes=80, optimizer_steps=80)
SORTED = [
    (0, 0, 1.0), (1, 0, 1.0), (2, 0, 0.578125), (3, 1, 1.0), (4, 1, 1.0), (5, 1, 0.875), (6, 2, 1.0), (7, 2, 1.0),
    (8, 2, 1.0), (9, 3, 0.71875), (10, 3, 1.0), (11, 3, 1.0), (12, 3, 0.65625), (13, 4, 1.0), (14, 4, 1.0),
    (15, 4, 1.0), (16, 5, 0.75), (32, 0, 1.0), (48, 5, 0.75), (64, 0, 1.0),
]  # fmt: skip


def coverage(readings: list[tuple[int, int, float]]) -> Coverage:
    cov = Coverage()
    cov.label_steps = list(readings)
    cov.last_step = 79
    return cov


def test_sorted_batches_read_by_their_observed_purity_are_found():
    weights = stretches([step for step, _, _ in SORTED])
    weighted = sum(w * share for w, (_, _, share) in zip(weights, SORTED, strict=True)) / sum(weights)
    plain = sum(share for _, _, share in SORTED) / len(SORTED)
    # the two straddling sparse readings, weighed as the 32 steps they stand for, would take the purity under the
    # threshold; read as the readings they are, it stays over it
    assert weighted < STEP_SHARE <= plain
    event = UnshuffledData().run_finding(coverage(SORTED), FACTS)
    assert event is not None and event.kind is FailureKind.UNSHUFFLED_DATA
    assert event.metrics["step_share"] == plain


def test_batches_whose_class_changes_at_every_step_are_not():
    """The same purity, the class changing at every step (streams taken in turn): the pairs keep no class."""
    turns = [(step, step % 5, share) for step, _, share in SORTED]
    assert UnshuffledData().run_finding(coverage(turns), FACTS) is None
