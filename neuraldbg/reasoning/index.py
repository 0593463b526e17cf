"""Events indexed for the engine, so that a diagnosis stays near-linear in the number of events.

The engine asks three kinds of question, each answered here without rescanning the pool:

* "the first unclaimed event of this kind, in this order" and "every unclaimed event of this kind starting at or
  after step k": a :class:`Lane` (sorted once; claimed events are stepped over through "next unclaimed"
  pointers with path compression, so each is stepped over about once; a start step is found by bisection);
* "every unclaimed event before (or after) forward position p that starts at or after step k": a
  :class:`RangeMax` over the events sorted by position, holding their start steps, visits only the subtrees
  whose largest start reaches k: O((answers + 1) log n).

Claiming is one flag in a shared :class:`Claims` array: an event claimed through one index disappears from all
of them (lazily, the next time an index steps on it).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence


class Claims:
    """Which events (by index in the engine's sorted list) belong to a hypothesis already."""

    def __init__(self, n: int) -> None:
        self.flags = bytearray(n)

    def __contains__(self, i: int) -> bool:
        return bool(self.flags[i])

    def add(self, i: int) -> None:
        self.flags[i] = 1


class Lane:
    """Event indices in a fixed order, skipping claimed ones. ``starts`` must be ascending for :meth:`scan`
    with a step (lanes sorted by onset first)."""

    def __init__(self, members: list[int], starts: list[int], claims: Claims) -> None:
        self.members = members
        self.starts = starts
        self._next = list(range(len(members) + 1))  # position -> a position at or after it not known claimed
        self._flags = claims.flags

    def _find(self, p: int) -> int:
        """The first position at or after ``p`` whose event is unclaimed (``len(members)`` when none)."""
        nxt, members, flags, n = self._next, self.members, self._flags, len(self.members)
        root = p
        while True:
            while nxt[root] != root:
                root = nxt[root]
            if root < n and flags[members[root]]:
                nxt[root] = root + 1
                continue
            break
        while nxt[p] != root:  # path compression
            nxt[p], p = root, nxt[p]
        return root

    def first(self) -> int | None:
        p = self._find(0)
        return self.members[p] if p < len(self.members) else None

    def scan(self, from_step: int | None = None) -> Iterator[int]:
        """Unclaimed members in order, from the first one starting at or after ``from_step``. Members claimed
        during the iteration are skipped."""
        p = 0 if from_step is None else bisect.bisect_left(self.starts, from_step)
        n = len(self.members)
        while True:
            p = self._find(p)
            if p >= n:
                return
            yield self.members[p]
            p += 1

    def __len__(self) -> int:
        return len(self.members)


_GONE = float("-inf")


class RangeMax:
    """Events in a fixed order (``keys`` ascending) with a value each; reports the unclaimed ones in a key range
    whose value reaches a threshold, leftmost first, in O((answers + 1) log n)."""

    def __init__(self, members: list[int], keys: Sequence[float], values: Sequence[float], claims: Claims) -> None:
        self.members = members
        self.keys = list(keys)
        size = 1
        while size < max(1, len(members)):
            size *= 2
        self._size = size
        tree = [_GONE] * (2 * size)
        tree[size : size + len(members)] = [float(v) for v in values]
        for node in range(size - 1, 0, -1):
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
        self._tree = tree
        self._flags = claims.flags

    def _remove(self, leaf: int) -> None:
        tree = self._tree
        node = leaf + self._size
        tree[node] = _GONE
        node //= 2
        while node and tree[node] != max(tree[2 * node], tree[2 * node + 1]):
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2

    def below(self, key: float) -> tuple[int, int]:
        """The leaf range of keys strictly below ``key``."""
        return 0, bisect.bisect_left(self.keys, key)

    def above(self, key: float) -> tuple[int, int]:
        """The leaf range of keys strictly above ``key``."""
        return bisect.bisect_right(self.keys, key), len(self.members)

    def scan(self, leaves: tuple[int, int], threshold: float) -> Iterator[int]:
        """Unclaimed members in the leaf range ``[lo, hi)`` whose value is at least ``threshold``, in key order."""
        lo, hi = leaves
        if lo >= hi:
            return
        tree, size, flags, members = self._tree, self._size, self._flags, self.members
        stack = [(1, 0, size)]
        while stack:
            node, a, b = stack.pop()
            if b <= lo or a >= hi or tree[node] < threshold:
                continue
            if node >= size:
                leaf = node - size
                if flags[members[leaf]]:
                    self._remove(leaf)
                    continue
                yield members[leaf]
                continue
            mid = (a + b) // 2
            stack.append((2 * node + 1, mid, b))
            stack.append((2 * node, a, mid))

    def first(self, leaves: tuple[int, int], threshold: float) -> int | None:
        return next(self.scan(leaves, threshold), None)
