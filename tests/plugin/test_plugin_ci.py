"""GitHub Actions annotations, escaped as the runner reads them; progress lines written past output capture."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pytest_neuraldbg import ci


def record(summary: str) -> dict[str, Any]:
    h = {"kind": "dead_neurons", "summary": summary, "explanation": "", "layer": "3", "step": 0, "chain": []}
    return {"nodeid": "t.py::test_x", "run": "1", "verdict": "unhealthy", "hypotheses": [h], "mermaid": ""}


def test_the_annotation_is_an_error_at_the_tests_line_with_the_verdict() -> None:
    found = ci.annotation("tests/test_x.py", 12, [record("dead_neurons at '3' from step 0 (confidence 1.00)")])
    assert found == (
        "::error file=tests/test_x.py,line=12,title=NeuralDBG::NeuralDBG: training is unhealthy - dead_neurons at "
        "'3' from step 0 (confidence 1.00)"
    )
    assert ci.annotation("t.py", 1, [{**record("x"), "verdict": "healthy", "hypotheses": []}]) is None


def test_messages_and_properties_are_escaped_per_githubs_rules() -> None:
    found = ci.annotation("dir,with:odd%name.py", 3, [record("100% dead\r\nat 'a,b:c' \x1b[2K")])
    assert found is not None
    where, message = found[len("::error ") :].split("::", 1)
    assert where == "file=dir%2Cwith%3Aodd%25name.py,line=3,title=NeuralDBG"
    assert "100%25 dead at 'a,b:c' \\x1b[2K" in message and "\n" not in found and "\r" not in found
    assert ci.escape_data("a%b\r\nc") == "a%25b%0D%0Ac"
    assert ci.escape_property("a:b,c") == "a%3Ab%2Cc"


def test_github_is_recognised_by_its_variable() -> None:
    assert ci.on_github({"GITHUB_ACTIONS": "true"}) and not ci.on_github({}) and not ci.on_github({"CI": "true"})


class Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.width_of_current_line = 0

    def line(self, text: str = "", **markup: bool) -> None:
        self.lines.append(text)


def config(verbose: int, writer: Writer) -> Any:
    return SimpleNamespace(
        option=SimpleNamespace(verbose=verbose),
        pluginmanager=SimpleNamespace(getplugin=lambda name: None),
        get_terminal_writer=lambda: writer,
    )


def test_a_long_run_reports_its_progress_every_few_seconds_without_v() -> None:
    writer, now = Writer(), [0.0]
    progress = ci.Progress(config(0, writer), "t.py::test_long", 1500, clock=lambda: now[0])
    for step in range(1, 1501):
        now[0] = step * 0.02  # 30 s in all
        progress(step, 0.5)
    assert writer.lines[0] == "neuraldbg: t.py::test_long: step 250/1500, loss 0.5 (5.0 s)"
    assert 5 <= len(writer.lines) <= 7 and writer.lines[-1].startswith("neuraldbg: t.py::test_long: step 1500/1500")
    progress.finish([])
    assert writer.lines[-1] == "neuraldbg: t.py::test_long: done, healthy"


def test_a_short_run_is_silent_without_v_and_reported_under_v() -> None:
    quiet, loud = Writer(), Writer()
    for verbose, writer in ((0, quiet), (1, loud)):
        progress = ci.Progress(config(verbose, writer), "t.py::test_short", 30, clock=lambda: 0.0)
        for step in range(1, 31):
            progress(step, 0.5)
        progress.finish(["dead_neurons at '3'"])
    assert quiet.lines == []
    assert loud.lines == [
        "neuraldbg: t.py::test_short: step 1/30, loss 0.5 (0.0 s)",
        "neuraldbg: t.py::test_short: step 30/30, loss 0.5 (0.0 s)",
        "neuraldbg: t.py::test_short: done, unhealthy: dead_neurons at '3'",
    ]
