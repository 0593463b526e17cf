"""The loss of every step of a run, in bounded memory: enough to judge whether it fell, against its own noise.

:class:`LossTrace` keeps the losses in at most :data:`BLOCKS` blocks of consecutive steps (count, sum, sum of
squares, extremes); when full, neighbouring blocks merge and blocks hold twice as many steps from then on, so the
blocks stay evenly spread over the run whatever its length. Means and spreads of any stretch of the run are exact
at block resolution. Non-finite losses are counted, not summed. The same sums of the losses' logarithms are kept
beside them, for a loss that stays positive (``positive``): it moves by factors, and is judged on a log scale.
Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Blocks kept (a multiple of 2).
BLOCKS = 64
#: Losses kept one by one at the start of the run (its initial level).
FIRST = 16


@dataclass(slots=True)
class Block:
    """Consecutive finite losses: steps ``first``..``last``."""

    first: int
    last: int
    n: int = 0
    total: float = 0.0
    squares: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    jumps: float = 0.0  # squared differences of consecutive losses ending in this block
    pairs: int = 0
    logs: float = 0.0  # the same of the logarithms of its positive losses
    log_squares: float = 0.0
    log_jumps: float = 0.0  # ... of consecutive losses both positive
    log_pairs: int = 0

    @property
    def mean(self) -> float:
        return self.total / self.n

    def add(self, step: int, value: float) -> None:
        self.last = step
        self.n += 1
        self.total += value
        self.squares += value * value
        self.low = min(self.low, value)
        self.high = max(self.high, value)
        if value > 0:
            log = math.log(value)
            self.logs += log
            self.log_squares += log * log

    def absorb(self, other: Block) -> None:
        self.last = other.last
        self.n += other.n
        self.total += other.total
        self.squares += other.squares
        self.low = min(self.low, other.low)
        self.high = max(self.high, other.high)
        self.jumps += other.jumps
        self.pairs += other.pairs
        self.logs += other.logs
        self.log_squares += other.log_squares
        self.log_jumps += other.log_jumps
        self.log_pairs += other.log_pairs


@dataclass(frozen=True)
class Stretch:
    """The losses of a stretch of the run: how many, their mean and standard deviation, the steps they span."""

    n: int
    mean: float
    sd: float
    first: int
    last: int

    @property
    def error(self) -> float:
        """The standard error of the mean."""
        return self.sd / math.sqrt(self.n) if self.n else math.inf


class LossTrace:
    """See the module docstring."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.size = 1  # losses per block
        self.count = 0  # finite losses
        self.nonfinite = 0
        self.first_nonfinite = -1
        self.negative = 0
        self.nonpositive = 0
        self.first: list[tuple[int, float]] = []  # the first FIRST finite losses
        self.last: tuple[int, float] | None = None
        self._jumps = 0.0  # sum of squared differences between consecutive finite losses
        self._pairs = 0

    def add(self, step: int, value: float) -> None:
        if not math.isfinite(value):
            self.nonfinite += 1
            if self.first_nonfinite < 0:
                self.first_nonfinite = step
            return
        self.count += 1
        self.negative += value < 0
        self.nonpositive += value <= 0
        jump = None if self.last is None else (value - self.last[1]) ** 2
        if jump is not None:
            self._jumps += jump
            self._pairs += 1
        log_jump = None
        if self.last is not None and value > 0 and self.last[1] > 0:
            log_jump = math.log(value / self.last[1]) ** 2
        self.last = (step, value)
        if len(self.first) < FIRST:
            self.first.append((step, value))
        blocks = self.blocks
        if not blocks or blocks[-1].n >= self.size:
            if len(blocks) >= BLOCKS:
                merged = [blocks[i] for i in range(0, len(blocks), 2)]
                for i in range(1, len(blocks), 2):
                    merged[i // 2].absorb(blocks[i])
                self.blocks = blocks = merged
                self.size *= 2
            if not blocks or blocks[-1].n >= self.size:
                blocks.append(Block(step, step))
        blocks[-1].add(step, value)
        if jump is not None:
            blocks[-1].jumps += jump
            blocks[-1].pairs += 1
        if log_jump is not None:
            blocks[-1].log_jumps += log_jump
            blocks[-1].log_pairs += 1

    @property
    def positive(self) -> bool:
        """Every finite loss above zero: one that moves by factors (the logarithm sums describe it)."""
        return self.count > 0 and not self.nonpositive

    def stretch(self, start: float, end: float) -> Stretch | None:
        """The losses of the blocks between the fractions ``start`` and ``end`` of the recorded ones (0 to 1), at
        least one block."""
        blocks = self.blocks
        if not blocks:
            return None
        a = min(int(start * len(blocks)), len(blocks) - 1)
        b = max(a + 1, math.ceil(end * len(blocks)))
        return combine(blocks[a:b])

    def noise(self) -> float:
        """The step-to-step spread of the loss around its local level (from the differences of consecutive losses,
        which a trend hardly affects: sqrt(mean squared difference / 2)); 0 with fewer than two losses."""
        return math.sqrt(self._jumps / (2 * self._pairs)) if self._pairs else 0.0

    def local_noise(self, start: float, end: float = 1.0, log: bool = False) -> float:
        """:meth:`noise` over the blocks between the fractions ``start`` and ``end`` of the recorded ones only: the
        spread where the loss is now, not where it began (a loss that fell a hundredfold jumped a hundred times
        less at its end); the whole run's when that stretch holds no pair of consecutive losses. ``log``: the
        spread of the losses' logarithms (for a :attr:`positive` loss)."""
        blocks = self.blocks[
            min(int(start * len(self.blocks)), max(len(self.blocks) - 1, 0)) : math.ceil(end * len(self.blocks))
        ]
        if log:
            pairs = sum(b.log_pairs for b in blocks)
            if not pairs:
                blocks = self.blocks
                pairs = sum(b.log_pairs for b in blocks)
            return math.sqrt(sum(b.log_jumps for b in blocks) / (2 * pairs)) if pairs else 0.0
        pairs = sum(b.pairs for b in blocks)
        return math.sqrt(sum(b.jumps for b in blocks) / (2 * pairs)) if pairs else self.noise()


def combine(blocks: list[Block], log: bool = False) -> Stretch | None:
    """The stretch of these blocks' losses, or (``log``) of their logarithms: exact for a :attr:`LossTrace.positive`
    loss."""
    n = sum(b.n for b in blocks)
    if not n:
        return None
    total = sum(b.logs if log else b.total for b in blocks)
    mean = total / n
    squares = sum(b.log_squares if log else b.squares for b in blocks)
    var = max(0.0, squares / n - mean * mean) * n / (n - 1) if n > 1 else 0.0
    return Stretch(n, mean, math.sqrt(var), blocks[0].first, blocks[-1].last)
