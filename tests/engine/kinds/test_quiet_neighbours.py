"""The vanishing detector's small-signal excuse asks, for each vanishing layer, whether a layer with a healthy
gradient comes before it and another sits beside it (same parent module). Worked out once per step
(:class:`_Healthy`), it gives what a pass over every layer per question gives: with none healthy, with the asking
layer among the healthy ones, with non-finite ones left out, and for top-level layers (parent "")."""

from __future__ import annotations

import random
from types import SimpleNamespace

from neuraldbg.detectors.base import LayerGradient
from neuraldbg.kinds.vanishing_gradients import _Healthy


def brute(order: list[str], grads: dict[str, LayerGradient], vanishing: set[str], layer: str) -> bool:
    here = order.index(layer)
    parent = layer.rpartition(".")[0]
    healthy = [other for other, g in grads.items() if other not in vanishing and not g.non_finite]
    return any(order.index(other) < here for other in healthy) and any(
        other != layer and other.rpartition(".")[0] == parent for other in healthy
    )


ORDER = [
    "emb",
    "blocks.0.q",
    "blocks.0.k",
    "blocks.0.v",
    "blocks.0",
    "blocks.1.q",
    "blocks.1.k",
    "blocks.1",
    "norm",
    "head",
]


def view_of(order: list[str]) -> SimpleNamespace:
    return SimpleNamespace(ctx=SimpleNamespace(position=lambda key: order.index(key[0])))


def test_the_step_s_counts_agree_with_a_pass_over_every_layer():
    rng = random.Random(0)
    agreed = {True: 0, False: 0}
    for _ in range(400):
        grads = {
            name: LayerGradient(norm=1.0, numel=4, exact_zero=False, non_finite=rng.random() < 0.15) for name in ORDER
        }
        vanishing = {name for name in ORDER if rng.random() < 0.5}
        healthy = _Healthy(view_of(ORDER), grads, vanishing)  # type: ignore[arg-type]
        for layer in ORDER:  # the asking layer vanishing or not: the rule is the same
            expected = brute(ORDER, grads, vanishing, layer)
            assert healthy.before_and_beside(layer, ORDER.index(layer)) == expected, (layer, vanishing, grads)
            agreed[expected] += 1
    assert min(agreed.values()) > 100  # both answers were asked for, many times


def test_the_asking_layer_does_not_stand_beside_itself():
    grads = {name: LayerGradient(norm=1.0, numel=4, exact_zero=False, non_finite=False) for name in ORDER}
    # healthy: the embedding (before everything) and blocks.1.q alone in its block
    vanishing = set(ORDER) - {"emb", "blocks.1.q"}
    healthy = _Healthy(view_of(ORDER), grads, vanishing)  # type: ignore[arg-type]
    assert not healthy.before_and_beside("blocks.1.q", ORDER.index("blocks.1.q"))
    assert healthy.before_and_beside("blocks.1.k", ORDER.index("blocks.1.k"))
    assert not healthy.before_and_beside("blocks.0.q", ORDER.index("blocks.0.q"))  # nobody healthy beside it
    assert healthy.before_and_beside("norm", ORDER.index("norm"))  # parent "": the embedding is beside it


def test_nothing_healthy_or_nothing_before():
    grads = {name: LayerGradient(norm=1.0, numel=4, exact_zero=False, non_finite=False) for name in ORDER}
    none = _Healthy(view_of(ORDER), grads, set(ORDER))  # type: ignore[arg-type]
    assert not any(none.before_and_beside(layer, ORDER.index(layer)) for layer in ORDER)
    late = _Healthy(view_of(ORDER), grads, set(ORDER) - {"head", "norm"})  # type: ignore[arg-type]
    assert not late.before_and_beside("emb", 0)  # healthy beside it, none before it
