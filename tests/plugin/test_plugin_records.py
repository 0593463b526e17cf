"""Run records: which layers the gradient chart shows, and records that survive any engine failure."""

from __future__ import annotations

import json
from types import SimpleNamespace

from neuraldbg.stats.history import History
from neuraldbg.text import json_number
from pytest_neuraldbg import records


class FakeDbg:
    def __init__(self, layers: list[str], parametric: list[str]) -> None:
        self.layers = layers
        self.history = History(16)
        for i, layer in enumerate(parametric):
            self.history.add("grad_norm", layer, 0, float(i))


def roots(layer: str) -> list:
    return [SimpleNamespace(root=SimpleNamespace(layer=layer))]


def labels(dbg: FakeDbg, root: str) -> list[tuple[str, str]]:
    return [(s["layer"], s["label"]) for s in records.grad_chart_series(dbg, roots(root))]


def test_a_root_without_parameters_is_charted_through_the_layer_that_feeds_it() -> None:
    dbg = FakeDbg(["0", "1", "2", "3", "4"], ["0", "2", "4"])
    assert labels(dbg, "3") == [("0", "first layer '0'"), ("2", "'2' (feeds root '3')"), ("4", "last layer '4'")]


def test_a_root_that_is_the_first_or_last_layer_is_one_line_with_both_roles() -> None:
    dbg = FakeDbg(["0", "1", "2"], ["0", "2"])
    assert labels(dbg, "0") == [("0", "first layer '0' (the root)"), ("2", "last layer '2'")]
    assert labels(dbg, "2") == [("0", "first layer '0'"), ("2", "root '2' (also the last layer)")]


def test_a_model_level_root_charts_only_the_first_and_last_layers() -> None:
    dbg = FakeDbg(["0", "1", "2"], ["0", "2"])
    assert [layer for layer, _ in labels(dbg, "")] == ["0", "2"]


def test_a_run_the_engine_cannot_summarise_becomes_an_error_record() -> None:
    class Broken:
        def hypotheses(self) -> list:
            raise RuntimeError("boom")

    rec = records.summarise(Broken(), nodeid="t.py::test_x", run="1")
    assert rec["verdict"] == "error" and rec["error"] == "NeuralDBG could not summarise this run: RuntimeError('boom')"


def test_non_finite_numbers_become_strings_so_records_are_strict_json() -> None:
    assert [json_number(x) for x in (1.5, float("inf"), float("-inf"), float("nan"))] == [1.5, "inf", "-inf", "nan"]
    json.dumps([json_number(float("nan"))], allow_nan=False)
