"""The rule that tells memorised labels from learned ones (``loss_evidence.memorised``), on per-sample readings made by
hand: each of its conditions is removed in turn by changing one number, and the finding must go. The training runs
that motivate it, with plain-torch truth, are in tests/runs/test_detect_memorised_labels.py."""

from __future__ import annotations

import dataclasses
import math

import pytest

from neuraldbg.capture.coverage import Coverage
from neuraldbg.kinds import loss_evidence
from neuraldbg.stats.losses import Stretch
from neuraldbg.stats.samples import LOSSES_FROM, SampleRepeats
from neuraldbg.stats.tensors import sample_outcomes

CHANCE = math.log(10)


def readings(
    new_loss: float,
    seen_loss: float,
    steps: int = 160,
    batch: int = 64,
    late_seen: float | None = None,
    new_hits: int | None = None,
) -> SampleRepeats:
    """Fully observed steps every 16 steps of ``batch`` samples: at step 0 all new; then half new and half seen
    until step 112, all seen after (at ``late_seen`` then, when given). Losses around the given levels (spread
    0.3). ``new_hits``: one new sample in every ``new_hits`` predicted right (1 in 10 of a guess among ten
    classes), the seen ones half; None: no hits read."""
    repeats = SampleRepeats()
    fresh = 0
    for step in range(0, steps, 16):
        new = batch if step == 0 else batch // 2 if step < 112 else 0
        ids = list(range(fresh, fresh + new)) + list(range(batch - new))  # the seen ones: drawn at step 0
        fresh += new
        seen = late_seen if late_seen is not None and not new else seen_loss
        losses = [(new_loss if k < new else seen) + (0.3 if k % 2 else -0.3) for k in range(batch)]
        read = losses if step >= LOSSES_FROM else []  # the samples' own losses are read from there on
        hits = None
        if new_hits is not None:
            hits = [float(k % new_hits == 0) if k < new else float(k % 2) for k in range(batch)]
        repeats.observe(step, [1.0 + i * 1e-2 for i in ids], read, hits)
    return repeats


def sparse_readings(late_new: float, late_seen: float, late_every: int = 1, spread: float = 0.8) -> SampleRepeats:
    """A training set drawn from with replacement, whose new samples run out before memorising shows: fully
    observed steps every 16 steps of 64 samples; at steps 16-96 half new, all at chance; from step 112 on one new
    sample on every ``late_every``-th step (at ``late_new``) and the seen ones at ``late_seen``. Losses spread by
    ``spread`` about those levels."""
    repeats = SampleRepeats()
    fresh = 64
    repeats.observe(0, [float(i) for i in range(64)], [])
    for k, step in enumerate(range(16, 320, 16)):
        early = step < 112
        new = 32 if early else int(k % late_every == 0)
        ids = list(range(fresh, fresh + new)) + list(range(64 - new))
        fresh += new
        levels = [CHANCE] * 64 if early else [late_new] * new + [late_seen] * (64 - new)
        losses = [level + (spread if (i + k) % 2 else -spread) for i, level in enumerate(levels)]
        repeats.observe(step, [float(i) for i in ids], losses if step >= LOSSES_FROM else [])
    return repeats


def curve(end: float) -> loss_evidence.Curve:
    stretch = Stretch(64, end, 0.1, 100, 160)
    return loss_evidence.Curve(
        losses=160,
        start=dataclasses.replace(stretch, mean=CHANCE, first=0, last=20),
        end=stretch,
        noise=0.1,
        verdict="fell",
        stopped=False,
        falling=False,
        second_half=(end, end),
        by_factors=True,
        half_noise=1.1,
        chance=CHANCE,
        classes=10,
        trained=1.0,
        large_updates="",
        band=0.05,
    )


def judged(repeats: SampleRepeats, end: float) -> dict[str, float] | None:
    coverage = Coverage()
    coverage.repeats = repeats
    return loss_evidence.memorised(coverage, curve(end))


def test_new_samples_at_chance_and_seen_ones_far_lower_are_memorised_labels():
    found = judged(readings(new_loss=CHANCE, seen_loss=1.8), end=2.0)
    assert found is not None
    assert found["new_loss"] == pytest.approx(CHANCE, abs=0.05) and found["seen_loss"] == pytest.approx(1.8, abs=0.05)
    assert found["new_from"] >= loss_evidence.NEW_FROM


@pytest.mark.parametrize(
    ("new_loss", "seen_loss", "end", "why"),
    [
        (0.8 * CHANCE, 1.2, 1.6, "new samples predicted better than a guess: learned from the inputs"),
        (CHANCE, CHANCE - 0.02, 2.25, "seen samples no lower than new ones: nothing memorised"),
        (CHANCE, 0.5, 0.5 * CHANCE, "the loss ended far below chance: learned, if late"),
    ],
)
def test_each_condition_is_needed(new_loss: float, seen_loss: float, end: float, why: str):
    assert judged(readings(new_loss=new_loss, seen_loss=seen_loss), end=end) is None, why


def test_new_samples_early_and_seen_ones_late_are_not_compared():
    """A slow learner: at chance on new and seen samples alike while new ones still come (steps 32-96), lower on
    seen ones only later, when every sample repeats (it learned, from its inputs, by then). At the same steps the
    two agree: no memorisation. (Comparing early new samples with late seen ones took 19 of 33 healthy slow or
    noisy-label classifiers of a hunt for memorisers.)"""
    assert judged(readings(new_loss=CHANCE, seen_loss=CHANCE, late_seen=1.5), end=0.8 * CHANCE) is None


def test_data_that_never_repeats_is_not_judged():
    repeats = SampleRepeats()
    for step in range(0, 160, 16):
        repeats.observe(step, [float(step * 100 + i) for i in range(64)], [CHANCE] * 64)
    assert not repeats.repeated and judged(repeats, end=2.0) is None


def test_a_samples_own_loss_averages_its_rows_and_leaves_out_the_ignored_ones():
    import torch

    log_probs = torch.log_softmax(torch.randn(6, 5, generator=torch.Generator().manual_seed(0)), dim=1)
    target = torch.tensor([1, -100, 3, 0, -100, -100])
    outcomes = sample_outcomes(log_probs, target, -100, 3)  # three samples of two rows each
    assert outcomes is not None
    found, hits = outcomes
    assert found[0] == pytest.approx(float(-log_probs[0, 1]))
    assert found[1] == pytest.approx(float(-(log_probs[2, 3] + log_probs[3, 0]) / 2))
    assert math.isnan(float(found[2]))  # every row ignored
    # ... and its hits: the share of its kept rows whose most likely class is the label
    best = log_probs.argmax(1)
    assert float(hits[0]) == float(best[0] == 1)
    assert float(hits[1]) == pytest.approx((float(best[2] == 3) + float(best[3] == 0)) / 2)
    assert math.isnan(float(hits[2]))
    assert sample_outcomes(log_probs, target, -100, 4) is None  # 6 rows are no whole number of rows for 4 samples


def test_samples_holding_inf_or_nan_get_no_fingerprint_and_break_nothing():
    repeats = SampleRepeats()
    repeats.observe(0, [1.0, math.inf, -math.inf, math.nan, 2.0], [1.0] * 5)
    repeats.observe(1, [1.0, 3.0], [])
    assert repeats.repeated and repeats.rows[0].new.n == 2  # 1.0 and 2.0 only; the cheap step adds no row
    assert len(repeats.rows) == 1


def test_an_inf_sample_on_a_cheap_step_is_no_repeat():
    repeats = SampleRepeats()
    repeats.observe(0, [math.inf, 1.0], [])
    repeats.observe(1, [math.inf, 2.0], [])
    assert not repeats.repeated


def test_memorising_that_shows_only_once_new_samples_are_rare_is_found_on_the_later_steps():
    """Early, new and seen samples are both at chance (nothing memorised yet) and outnumber the later ones, so
    over every step the gap is lost in their noise; over the second half of the steps the few new samples left are
    at chance and the seen ones far lower."""
    repeats = sparse_readings(late_new=CHANCE, late_seen=1.5)
    found = judged(repeats, end=2.0)
    assert found is not None
    assert found["new_from"] >= 304 // 2 and found["new_samples"] >= loss_evidence.NEW_LATE
    assert found["seen_loss"] == pytest.approx(1.5, abs=0.05)
    every = repeats.paired(loss_evidence.NEW_FROM)
    assert every is not None and not every[2] > 2 * every[3]  # over every step: no gap by two standard errors


@pytest.mark.parametrize(
    ("late_new", "late_seen", "late_every", "why"),
    [
        (0.7 * CHANCE, 1.5, 1, "the late new samples predicted better than a guess"),
        (CHANCE, CHANCE - 0.05, 1, "the late seen samples no lower than the new ones"),
        (CHANCE, 1.5, 4, "too few new samples late (2 of them)"),
    ],
)
def test_each_condition_of_the_later_steps_is_needed(late_new: float, late_seen: float, late_every: int, why: str):
    assert judged(sparse_readings(late_new, late_seen, late_every), end=2.0) is None, why


def test_new_samples_whose_class_is_picked_far_more_often_than_a_guess_are_not_memorised_labels():
    """New samples at chance by their loss (a model overconfident on noisy labels) but predicted right one time in
    two: learned from the inputs. One time in ten, a guess among ten classes: memorised."""
    found = judged(readings(new_loss=CHANCE, seen_loss=1.8, new_hits=10), end=2.0)
    assert found is not None and found["new_accuracy"] == pytest.approx(0.1, abs=0.03)
    assert found["guess_accuracy"] == pytest.approx(0.1)
    assert judged(readings(new_loss=CHANCE, seen_loss=1.8, new_hits=2), end=2.0) is None
