"""A fully observed step files every layer's reading of one metric in one call (:meth:`History.add_each`): the
series it leaves, their order and their points are what one :meth:`History.add` per layer leaves, with NaN and
None left out (a loss keeps its NaN), past the capacity where a series starts keeping every other point."""

from __future__ import annotations

import math
import random

from neuraldbg.stats.history import History


def test_one_call_per_metric_leaves_what_one_call_per_layer_leaves():
    rng = random.Random(0)
    layers = [f"blocks.{i}" for i in range(12)]
    one, each = History(16), History(16)
    for step in range(70):
        for metric in ("grad_norm", "loss", "update_ratio"):
            values = []
            for layer in rng.sample(layers, rng.randint(0, len(layers))):
                draw = rng.random()
                value = math.nan if draw < 0.1 else None if draw < 0.15 else math.inf if draw < 0.2 else rng.random()
                values.append((layer, value))
            for layer, value in values:
                one.add(metric, layer, step, value)  # type: ignore[arg-type]
            each.add_each(metric, step, values)  # type: ignore[arg-type]
    assert list(each.series) == list(one.series)  # the same series, made in the same order
    for key, series in one.series.items():
        mine = each.series[key].points()
        assert [s for s, _ in mine] == [s for s, _ in series.points()], key
        assert all(a == b or (math.isnan(a) and math.isnan(b)) for (_, a), (_, b) in zip(mine, series.points()))
    assert any(math.isnan(v) for key, s in one.series.items() if key[0] == "loss" for _, v in s.points())
    assert not any(math.isnan(v) for key, s in one.series.items() if key[0] != "loss" for _, v in s.points())
    assert any(len(s) < 70 and s._stride > 1 for s in one.series.values())  # the capacity was reached
