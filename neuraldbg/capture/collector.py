"""Python's garbage collector kept out of the debugger's own bookkeeping.

A fully observed step makes thousands of short-lived objects per layer and parameter (readings, findings, the keys
the tracker follows), most of which die within the same call. Python's collector runs whenever allocations outnumber
deallocations by a threshold; one that runs in the middle of such a call finds those objects alive, moves them to an
older generation, and counts them towards the next *full* collection, which walks every tracked object of the
process (about 290,000 once torch is imported, 350,000 once transformers is too, before any model is built). The
debugger's calls then set off full collections the training loop never would have.

:func:`paused` switches automatic collection off for the length of one of the debugger's calls from torch (a step's
commit and flush, a step closed by ``dbg.step()``, the optimizer step's pre- and post-hooks, the backward-call
listener before and after the pass, the hook on the loss gradient and the callback at the end of the backward pass,
the end of a block) and back on as it returns or raises. The count of allocations goes on, so the first allocation
after the call collects, once the call's temporaries are gone. Nothing is collected that would not have been, and
the training's values do not change: only when cycles of garbage are freed moves, by the length of the call.

The training's own code (the model's forward, the loss, the optimizer's update) runs with collection as the script
left it. What the debugger calls inside such a call runs paused with it: the detectors of plugins, in the analysis,
and the handlers of the warnings and log records the debugger emits. Collection that was off when the call began (a
script that disabled it) stays off. The switch is the process's: another thread that disables collection while such
a call runs finds it on again when the call returns (a script that turns collection off from a second thread during
training; none of torch's threads does).

Measured on the 5,000 parameter tensors' first 64 steps (``python -m benchmarks.collector``; docs/cost.md, "fifteenth
session"): full collections 6 to 2, young ones 1,532 to 587, the collector's time 1.33 s to 0.55 s (a plain run: 1
full collection, 600 young ones, ~0.23 s).
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
        try:  # switched off inside: an interrupt (Ctrl-C, a test's timeout signal) raised as it returns is caught
            _disable()
            return fn(*args, **kwargs)
        finally:
            _enable()

    return call
