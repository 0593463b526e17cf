"""Numbers, steps, names and ranks in words: the small formatting vocabulary the engine and the plugin share.

Pure functions of plain values; imports nothing of NeuralDBG and no torch, so the pytest plugin and the report
writers use it freely. Everything people read says a number, a step range or a list of names the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def num(x: float) -> str:
    """A number as people read it in a diagnosis: 3e-18, 0.12, 4.2e+05, inf, nan."""
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.3g}"
    return f"{x:.1e}".replace("e-0", "e-").replace("e+0", "e+")


def pct(x: float) -> str:
    """A fraction as a percentage: 100%, 7%, 0.3%."""
    return f"{100 * x:.0f}%" if x >= 0.01 or x == 0 else f"{100 * x:.1g}%"


def count(x: float) -> str:
    """A count: 12, or the number as :func:`num` writes it when it is not finite."""
    return str(int(x)) if math.isfinite(x) else num(x)


def span(start: int, end: int) -> str:
    """``step 3`` or ``steps 0-32``."""
    return f"step {start}" if start == end else f"steps {start}-{end}"


def quoted(names: Sequence[str], limit: int = 4) -> str:
    """``'0', '2' and 3 more``: names quoted (``""`` is the model), the first ``limit`` of them."""
    shown = [f"'{n}'" if n else "the model" for n in names]
    if len(shown) <= limit:
        return ", ".join(shown)
    return ", ".join(shown[:limit]) + f" and {len(shown) - limit} more"


def rank_list(ranks: Sequence[int]) -> str:
    """``0``, ``0, 2``, ``0-3, 5``: sorted ranks with runs of three or more as ranges."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ordered[i]}-{ordered[j]}")
        else:
            parts.extend(str(r) for r in ordered[i : j + 1])
        i = j + 1
    return ", ".join(parts)


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 1`` or ``ranks 0-3, 5``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}"


def cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending with an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(text: str, limit: int) -> str:
    """``text`` on one line (runs of white space become one space), at most ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


#: The largest integer every JSON reader holds exactly (2**53 - 1): the largest step or count a trace or a baseline
#: file accepts.
JSON_EXACT = 2**53 - 1


def json_number(x: float) -> float | str:
    """A float JSON can hold: itself when finite, else the string ``"inf"``, ``"-inf"`` or ``"nan"`` (how traces
    and reports write non-finite numbers)."""
    x = float(x)
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def evenly(items: Sequence[T], count: int) -> list[T]:
    """At most ``count`` of ``items``, evenly spread, the first and the last included."""
    if len(items) <= count:
        return list(items)
    if count <= 1:
        return [items[-1]] if count == 1 else []
    picks = sorted({round(i * (len(items) - 1) / (count - 1)) for i in range(count)})
    return [items[i] for i in picks]


def nearest(points: Sequence[tuple[int, float]], step: int) -> float | None:
    """The value of the point whose step is nearest to ``step`` (the earlier one on a tie); None without points."""
    if not points:
        return None
    return min(points, key=lambda p: (abs(p[0] - step), p[0]))[1]


def printable(path: object) -> str:
    """A file name as it can be printed on one line (``repr`` when it holds control characters)."""
    return path if isinstance(path, str) and path.isprintable() else repr(path)
