"""The fingerprints a run remembers are scaled by one power of two (neuraldbg.stats.samples.HASH_SHIFT): the same
samples meet as before, bit for bit, and the set's lookups stop colliding."""

from __future__ import annotations

import math
import random

import torch

from neuraldbg.stats.samples import HASH_SHIFT, SampleRepeats
from neuraldbg.stats.tensors import sample_prints


def _low_hash_bits(values: list[float] | set[float], bits: int = 17) -> int:
    """How many distinct values the low ``bits`` bits of the values' hashes take (the slots a set's table picks)."""
    return len({hash(v) & ((1 << bits) - 1) for v in values})


def _batches(features: int, scale: float, steps: int = 320, dtype: torch.dtype = torch.float32) -> list[list[float]]:
    g = torch.Generator().manual_seed(features)
    out = []
    for _ in range(steps):
        prints = sample_prints((torch.randn(32, features, generator=g) * scale).to(dtype))
        assert prints is not None
        out.append(prints.tolist())
    return out


def _reference(steps: list[tuple[list[float], list[float]]]) -> tuple[bool, list[tuple[int, int]]]:
    """What SampleRepeats finds, by the plain rule on the raw fingerprints: whether a finite fingerprint came round
    again on a later step, and on each step with losses the count of its new and seen samples."""
    seen: set[float] = set()
    repeated = False
    rows = []
    for prints, losses in steps:
        finite = [p for p in prints if math.isfinite(p)]
        if len(losses) != len(prints):
            repeated = repeated or any(p in seen for p in finite)
            seen.update(finite)
            continue
        new = old = 0
        fresh = []
        for p, loss in zip(prints, losses):
            if not math.isfinite(p):
                continue
            met = p in seen
            repeated = repeated or met
            if not met:
                fresh.append(p)
            if math.isfinite(loss):
                old, new = old + met, new + (not met)
        seen.update(fresh)
        rows.append((new, old))
    return repeated, rows


def _run(steps: list[tuple[list[float], list[float]]]) -> tuple[bool, list[tuple[int, int]], SampleRepeats]:
    repeats = SampleRepeats()
    for i, (prints, losses) in enumerate(steps):
        repeats.observe(i, prints, losses)
    return repeats.repeated, [(r.new.n, r.seen.n) for r in repeats.rows], repeats


def test_float32_fingerprints_are_remembered_apart_in_the_hash():
    for features, scale in ((10, 1.0), (784, 3.0), (16, 0.01), (3072, 100.0)):
        batches = _batches(features, scale)
        raw = {p for b in batches for p in b}
        repeats = SampleRepeats()
        for i, prints in enumerate(batches):
            repeats.observe(i, prints, [])
        assert len(repeats._seen) == len(raw)  # nothing merged
        # a set of raw float32 fingerprints lands in a few slots (the 28th session measured 23 of 10,240 at 10
        # features); scaled, they spread as random hashes would (about 9,850 of 10,240 in 2 ** 17 slots)
        assert _low_hash_bits(repeats._seen) >= 0.9 * len(raw), (features, scale)
    assert _low_hash_bits({p for b in _batches(10, 1.0) for p in b}) < 1000  # the raw ones: the case being fixed


def test_the_scale_is_a_power_of_two_set_by_the_first_finite_fingerprint():
    repeats = SampleRepeats()
    repeats.observe(0, [math.nan, 0.0, math.inf], [])
    assert repeats._scale is None  # nothing finite and non-zero yet: kept as they are
    repeats.observe(1, [0.0, 12.5, 3.0], [])
    assert repeats._scale is not None
    mantissa, _ = math.frexp(repeats._scale)
    assert mantissa == 0.5  # a power of two: every finite fingerprint scales exactly
    assert math.frexp(12.5 * repeats._scale)[1] == HASH_SHIFT
    finite = {v for v in repeats._seen if math.isfinite(v)}  # a NaN stays in the set, never met again
    assert finite == {0.0, 12.5 * repeats._scale, 3.0 * repeats._scale}


def test_scaled_fingerprints_meet_exactly_when_the_raw_ones_do():
    # float32 and float64 fingerprints, repeats, neighbouring doubles, signed zeros, inf and NaN: the verdicts and
    # the rows of new and seen samples are those of the raw values compared as they are
    rng = random.Random(0)
    for dtype in (torch.float32, torch.float64):
        pool = [p for b in _batches(12, 2.0, steps=40, dtype=dtype) for p in b]
        pool += [math.nextafter(p, math.inf) for p in pool[:50]] + [0.0, -0.0, math.inf, -math.inf, math.nan]
        for trial in range(20):
            steps = []
            for _ in range(30):
                prints = rng.sample(pool, 16)
                losses = [rng.random() for _ in prints] if rng.random() < 0.3 else []
                steps.append((prints, losses))
            repeated, rows, _ = _run(steps)
            assert (repeated, rows) == _reference(steps), (dtype, trial)
    fresh = [(p, []) for p in ([1.0, 2.0], [math.nextafter(1.0, 2.0), math.nextafter(2.0, 0.0)])]
    assert _run(fresh)[0] is False  # neighbours are different samples
    assert _run([([1.0, 2.0], []), ([5.0, 2.0], [])])[0] is True


def test_huge_and_tiny_fingerprints_do_not_overflow_the_scale():
    repeats = SampleRepeats()
    repeats.observe(0, [1e-300, 2e-300], [])
    assert repeats._scale == 2.0**64  # held at the limit
    repeats.observe(1, [1e200, 1e-300], [])
    assert repeats.repeated  # the tiny one again, found
    assert all(math.isfinite(v) for v in repeats._seen)
