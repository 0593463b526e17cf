"""The rule that finds labels memorised in an epoch loop (``loss_evidence.memorised_by_epochs``), on readings made by
hand: a loss that falls only where epochs start is found, and each condition is removed in turn by changing one
number. The training runs that motivate it, with plain-torch truth, are in
tests/runs/test_shuffled_labels_in_epoch_loops.py."""

from __future__ import annotations

import dataclasses
import math

import pytest

from neuraldbg.capture.coverage import Coverage
from neuraldbg.kinds import loss_evidence
from neuraldbg.stats.losses import Stretch
from neuraldbg.stats.samples import SampleRepeats

CHANCE = math.log(4)
SAMPLES = 2048


def epoch_loop(
    batch: int = 64,
    epochs: int = 8,
    at_starts: float = 0.05,
    amid: float = 0.0,
    first: float = CHANCE,
    replacement: bool = False,
    noise: float = 0.02,
) -> SampleRepeats:
    """The fingerprints and losses of a loop over ``SAMPLES`` samples in batches of ``batch``, reshuffled every
    epoch (or drawn with replacement): the loss stays at ``first`` over the first epoch, then drops by ``at_starts``
    where each epoch starts and by ``amid`` over each epoch, evenly, step by step; a noise of +-``noise``
    alternates on top."""
    repeats = SampleRepeats()
    per_epoch = SAMPLES // batch
    state = 12345
    for epoch in range(epochs):
        order = list(range(SAMPLES))
        for i in range(SAMPLES - 1, 0, -1):  # a fixed pseudo-random permutation per epoch
            state = (state * 1103515245 + 12345) % 2**31
            j = state % (i + 1)
            order[i], order[j] = order[j], order[i]
        for k in range(per_epoch):
            step = epoch * per_epoch + k
            if replacement:
                ids = [(step * 7919 + n * 104729) % SAMPLES for n in range(batch)]
            else:
                ids = order[k * batch : (k + 1) * batch]
            later = max(0, step - per_epoch) / per_epoch  # epochs since the first ended
            loss = first - at_starts * epoch - amid * later + (noise if step % 2 else -noise)
            repeats.observe(step, [1.0 + i * 1e-3 for i in ids], [], loss=loss)
    return repeats


def curve(end: float, band: float = 0.05) -> loss_evidence.Curve:
    stretch = Stretch(64, end, 0.05, 200, 255)
    return loss_evidence.Curve(
        losses=256,
        start=dataclasses.replace(stretch, mean=CHANCE, first=0, last=20),
        end=stretch,
        noise=0.03,
        verdict="fell",
        stopped=False,
        falling=False,
        second_half=(end, end),
        by_factors=True,
        half_noise=1.05,
        chance=CHANCE,
        classes=4,
        trained=1.0,
        large_updates="",
        band=band,
    )


def judged(repeats: SampleRepeats, end: float = 0.8 * CHANCE) -> dict[str, float] | None:
    coverage = Coverage()
    coverage.repeats = repeats
    return loss_evidence.memorised_by_epochs(coverage, curve(end))


def test_an_epoch_loop_is_told_by_its_samples_and_one_that_draws_with_replacement_is_not():
    assert epoch_loop().epoch_length() == SAMPLES // 64
    assert epoch_loop(batch=100).epoch_length() == 20  # 2,000 samples a epoch: 48 never drawn, new in the next
    assert epoch_loop(replacement=True).epoch_length() is None


def test_a_loss_that_falls_only_where_epochs_start_is_memorised_labels():
    found = judged(epoch_loop())
    assert found is not None
    assert found["epoch_steps"] == 32 and found["epoch_starts"] == 7
    assert found["epoch_drop"] == pytest.approx(0.05, abs=0.01) and abs(found["amid_drop"]) < 0.01
    assert found["first_epoch_loss"] == pytest.approx(CHANCE, abs=0.01)
    # a steady fall amid the epochs beside larger steps where they start is still found
    assert judged(epoch_loop(at_starts=0.1, amid=0.24)) is not None


@pytest.mark.parametrize(
    ("repeats", "end", "why"),
    [
        (epoch_loop(at_starts=0.0, amid=0.05), 0.8 * CHANCE, "the loss falls amid the epochs alike: it learns"),
        (epoch_loop(at_starts=0.04, amid=0.24), 0.8 * CHANCE, "the fall amid epochs is over half of the steps'"),
        (epoch_loop(first=0.9 * CHANCE), 0.7 * CHANCE, "the first epoch's new samples were predicted better"),
        (epoch_loop(), 0.5 * CHANCE, "the loss ended far below chance: learned, if late"),
        (epoch_loop(replacement=True), 0.8 * CHANCE, "no epoch loop: samples drawn with replacement"),
        (epoch_loop(batch=256, epochs=16), 0.8 * CHANCE, "an epoch of 8 steps: too short to tell"),
        (epoch_loop(epochs=2, at_starts=0.15), 0.9 * CHANCE, "one epoch start only"),
        (epoch_loop(at_starts=0.003), 0.99 * CHANCE, "steps too small for the losses' noise"),
        (epoch_loop(at_starts=0.18, noise=0.2), 0.8 * CHANCE, "steps over amid ones within the losses' noise"),
        (epoch_loop(at_starts=0.05, amid=-0.2), 0.9 * CHANCE, "drops where epochs start undo climbs amid them"),
    ],
)
def test_each_condition_is_needed(repeats: SampleRepeats, end: float, why: str):
    assert judged(repeats, end) is None, why


def test_a_step_without_its_loss_leaves_the_epochs_unjudged():
    repeats = epoch_loop()
    step, share, _ = repeats.steps[40]
    repeats.steps[40] = (step, share, math.nan)
    assert judged(repeats) is None
