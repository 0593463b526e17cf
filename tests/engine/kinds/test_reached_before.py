"""The vanishing detector's "a layer before it got a healthy gradient" for a step's exact zeros, worked out once per
step (a running largest by forward position), gives what a pass over every layer gives: for leaf layers, for a
layer with layers inside it (their outputs come before its own, and they do not count), and with nothing before."""

from __future__ import annotations

import random
from types import SimpleNamespace

from neuraldbg.config import DebugConfig
from neuraldbg.detectors.base import LayerGradient
from neuraldbg.kinds.vanishing_gradients import _clearly_healthy, _ReachedBefore


def brute(order: list[str], grads: dict[str, LayerGradient], layer: str, top: float) -> float:
    cfg = DebugConfig()
    here = order.index(layer)
    return max(
        (
            g.norm
            for other, g in grads.items()
            if other != layer
            and not other.startswith(layer + ".")
            and not g.exact_zero
            and _clearly_healthy(g.norm, top, cfg)
            and order.index(other) < here
        ),
        default=0.0,
    )


def test_the_running_largest_agrees_with_a_pass_over_every_layer():
    rng = random.Random(0)
    # forward order of outputs: a container's comes after those of the layers inside it
    order = ["enc.0", "enc.1", "enc", "mid", "head.a", "head.b", "head", "out"]
    view = SimpleNamespace(ctx=SimpleNamespace(position=lambda key: order.index(key[0]), config=DebugConfig()))
    for _ in range(200):
        grads = {}
        for name in order:
            zero = rng.random() < 0.4
            norm = 0.0 if zero else 10 ** rng.uniform(-9, 1)
            grads[name] = LayerGradient(norm=norm, numel=10, exact_zero=zero, non_finite=False)
        top = max(g.norm for g in grads.values())
        reached = _ReachedBefore(view, grads, top)  # type: ignore[arg-type]
        for layer in order:
            assert reached(layer) == brute(order, grads, layer, top), (layer, grads)
