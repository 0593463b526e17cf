"""Which samples a model has seen before, and its loss on those and on the ones it has not.

Each sample of every training step's input batch, for the first :data:`PRINT_STEPS` steps, is reduced on the device
to one number (its values weighed by fixed pseudo-random weights and summed, see
:func:`neuraldbg.stats.tensors.sample_prints`), read at the flush with the step's other readings and compared
exactly: the same sample gives the same number in any batch of the same size (on a CPU, in batches of 4, 8, 16, 32,
64 or 128 samples alike; a batch of another size may sum its rows in another order, and a repeat it holds goes
unseen, which only makes the finding rarer). On fully observed
steps comes with it, for a classifier's ``nll_loss`` (``cross_entropy``), each sample's own loss and whether the
model's most likely class was its label (its share of rows that were, for a sample of several). A sample whose
fingerprint was met before (on any step: a cheap one too) is *seen*; the others are *new*. Per fully observed step
:class:`SampleRepeats` keeps the sum, the sum of squares and the count of the losses of each group, and the sum of
its hits.

What it tells: a model whose labels do not follow from its inputs cannot predict a sample it has not seen better
than chance, whatever it does with the ones it sees again (it memorises them); a model that learns from its inputs
does better on new samples too (see :mod:`neuraldbg.kinds.loss_evidence`). Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Training steps whose samples are fingerprinted, at most (the smoke runs and short fits the finding is for; past
#: them nothing is added, and a run this long is judged on its first steps' samples).
PRINT_STEPS = 1024
#: Fingerprints remembered, at most: past it, samples not remembered count as new (a data set this large repeats
#: too late for a short run to memorise it).
LIMIT = 1 << 17
#: The samples' own losses are read from this step on (a model's first steps are at chance whatever its labels:
#: the earlier ones would tell nothing, and the smoke regime's fully observed first steps stay as cheap as they were).
LOSSES_FROM = 32
_INFINITE = (math.inf, -math.inf)
#: The fingerprints are remembered scaled by one power of two, fixed at the first finite one: ``2 ** (HASH_SHIFT -
#: e)``, ``e`` that one's binary exponent (:func:`math.frexp`). A power of two scales a float exactly, so two scaled
#: fingerprints are equal exactly when the fingerprints are; what moves is the hash. Python hashes a float by its
#: mantissa rotated by its exponent, and a fingerprint summed in float32 has the low 29 bits of its float64 mantissa
#: zero: at most magnitudes the bits that pick a slot of the set's table are then those zeros and a few leading
#: ones, the same for most samples (10,240 fingerprints of a 10-feature batch: 23 distinct values of the low 17 hash
#: bits), and every lookup walks a chain of collisions. Scaled, those bits are the float32 mantissa's (9,800 of the
#: 10,240 distinct, as random hashes would give, from fingerprints of 0.01 to 10,000).
HASH_SHIFT = 22
#: ... the power of two at most ``2 ** SCALE_LIMIT`` and at least its inverse (a scaled fingerprint overflows only
#: past 2 ** 960).
SCALE_LIMIT = 64
#: Fully observed steps kept, at most (past it, every other one is dropped: the run is covered evenly).
ROWS = 256


@dataclass(slots=True)
class Losses:
    """The per-sample losses of one group: their sum, sum of squares and count; and how many of those samples the
    model predicted right (``hits``, of ``judged``: the samples whose hit was read)."""

    total: float = 0.0
    squares: float = 0.0
    n: int = 0
    hits: float = 0.0
    judged: int = 0

    def add(self, value: float, hit: float = math.nan) -> None:
        self.total += value
        self.squares += value * value
        self.n += 1
        if math.isfinite(hit):
            self.hits += hit
            self.judged += 1

    def merge(self, other: Losses) -> None:
        self.total += other.total
        self.squares += other.squares
        self.n += other.n
        self.hits += other.hits
        self.judged += other.judged

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else math.nan

    @property
    def accuracy(self) -> float:
        """The share of the judged samples predicted right (NaN without any)."""
        return self.hits / self.judged if self.judged else math.nan


@dataclass(slots=True)
class Row:
    """One fully observed step: the losses of its new and of its seen samples."""

    step: int
    new: Losses
    seen: Losses


#: New and seen samples compared on the same steps (see :meth:`SampleRepeats.paired`).
Paired = tuple[Losses, Losses, float, float, int, int]


class SampleRepeats:
    """See the module docstring."""

    def __init__(self) -> None:
        self._seen: set[float] = set()  # the fingerprints met, scaled (see HASH_SHIFT)
        self._scale: float | None = None
        self.rows: list[Row] = []
        self.repeated = False  # a sample came round again
        self.printed = 0  # steps whose fingerprints were taken in
        self._stride = 1
        self._offered = 0

    @property
    def printing(self) -> bool:
        """Whether the next steps' fingerprints are still wanted."""
        return self.printed < PRINT_STEPS

    def observe(self, step: int, prints: list[float], losses: list[float], hits: list[float] | None = None) -> None:
        """One step's fingerprints, and its samples' losses in the same order (empty when they were not read: a
        cheap step; NaN for a sample that has none), and their hits likewise (None or another length: not read)."""
        if not self.printing:
            return
        self.printed += 1
        prints = self._keys(prints)
        if len(losses) != len(prints):  # a cheap step: only what was seen (set operations, no loop in Python)
            if not self.repeated:
                self.repeated = not self._seen.isdisjoint(prints)
            if len(self._seen) < LIMIT:
                self._seen.update(prints)
                self._seen.difference_update(_INFINITE)  # a sample holding inf: no fingerprint (NaN never matches)
            return
        row = Row(step, Losses(), Losses())
        fresh: list[float] = []
        if hits is None or len(hits) != len(prints):
            hits = [math.nan] * len(prints)
        for p, loss, hit in zip(prints, losses, hits):
            if not math.isfinite(p):  # a sample holding inf or NaN (the non-finite rooms' story): no fingerprint
                continue
            seen = p in self._seen
            self.repeated = self.repeated or seen
            if not seen:
                fresh.append(p)
            if math.isfinite(loss):
                (row.seen if seen else row.new).add(loss, hit)
        if len(self._seen) < LIMIT:
            self._seen.update(fresh)
        offered, self._offered = self._offered, self._offered + 1
        if offered % self._stride:
            return
        self.rows.append(row)
        if len(self.rows) > ROWS:  # keep every other row, and take every other one from now on
            self.rows = self.rows[::2]
            self._stride *= 2

    def _keys(self, prints: list[float]) -> list[float]:
        """``prints`` scaled by the run's power of two (see :data:`HASH_SHIFT`), in one call over the list; as they
        are until a finite non-zero fingerprint fixes it."""
        scale = self._scale
        if scale is None:
            first = next((p for p in prints if p and math.isfinite(p)), None)
            if first is None:
                return prints
            shift = HASH_SHIFT - math.frexp(first)[1]
            scale = self._scale = math.ldexp(1.0, max(-SCALE_LIMIT, min(SCALE_LIMIT, shift)))
        return list(map(scale.__mul__, prints))

    def paired(self, since: int) -> Paired | None:
        """New and seen samples compared on the same steps, from ``since`` on: the losses of each group over the
        steps whose batch holds both, the mean of the steps' differences (new minus seen) weighed by their
        precision, its standard error (from one spread of the per-sample losses, pooled over those steps), and the
        first and last of those steps. None without two such steps."""
        rows = [r for r in self.rows if r.step >= since and r.new.n and r.seen.n]
        if len(rows) < 2:
            return None
        new, seen = Losses(), Losses()
        for r in rows:
            new.merge(r.new)
            seen.merge(r.seen)
        n = new.n + seen.n
        squares = new.squares + seen.squares
        centred = squares - sum(r.new.total**2 / r.new.n + r.seen.total**2 / r.seen.n for r in rows)
        spread = max(0.0, centred) / max(n - 2 * len(rows), 1)  # within-group variance
        weights = [1 / (1 / r.new.n + 1 / r.seen.n) for r in rows]
        total = sum(weights)
        difference = sum(w * (r.new.mean - r.seen.mean) for w, r in zip(weights, rows)) / total
        error = math.sqrt(spread / total)
        return new, seen, difference, error, rows[0].step, rows[-1].step
