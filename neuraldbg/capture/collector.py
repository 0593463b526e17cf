"""Python's garbage collector kept out of the debugger's own bookkeeping.

A fully observed step makes thousands of short-lived objects per layer and parameter (readings, findings, the keys
the tracker follows), most of which die within the same call. Python's collector runs whenever allocations outnumber
deallocations by a threshold; one that runs in the middle of such a call finds those objects alive, moves them to an
older generation, and counts them towards the next *full* collection, which walks every object of the process (torch
alone is ~300k; a process that imported transformers holds over a million). The debugger's calls then set off full
collections the training loop never would have.

:func:`paused` switches automatic collection off for the length of one of the debugger's calls (a step's commit and
flush, an optimizer step's hooks) and back on as it returns or raises; the count of allocations goes on, so the first
allocation after it collects, once the call's temporaries are gone. Nothing is collected that would not have been,
and the training's values do not change: only when cycles of garbage are freed moves, by the length of the call.
Measured on the 5,000 parameter tensors' first 64 steps (docs/cost.md): 5 full collections to 3, 1,512 young ones to
about 750. Collection that was off when the call began (a script that disabled it) stays off.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")

_enabled = gc.isenabled
_disable = gc.disable
_enable = gc.enable


def paused(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` with automatic garbage collection off while it runs (see the module); a call nested in another paused
    one changes nothing."""

    @functools.wraps(fn)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not _enabled():
            return fn(*args, **kwargs)
        _disable()
        try:
            return fn(*args, **kwargs)
        finally:
            _enable()

    return call
