"""Pictures of unhealthy runs (``--neuraldbg-report``, the ``plots`` extra): valid files whose data is the run's
history, linked from summary.md, inline in report.html, attached to the JUnit cases; without matplotlib the reports
say how to get them."""

from __future__ import annotations

import html.parser
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from integration_support import SILENT_TESTS, junit_cases

from neuraldbg.export import pictures

pytest.importorskip("matplotlib")
# draw once now: pytester unloads the modules an in-process run imported, and matplotlib does not survive that
pictures.render("gradient-flow", pictures.Grid("grad_norm", ["a"], [0, 1], [[1.0, 2.0]]), pictures.Marks(), "svg")
pictures.render("loss", [(0, 1.0), (1, 0.5)], pictures.Marks(), "png")


@pytest.fixture
def out(project: pytest.Pytester) -> Path:
    project.makepyfile(test_silent=SILENT_TESTS)
    result = project.runpytest(
        "--neuraldbg-report=report",
        "--neuraldbg-junit=health.xml",
        "--junitxml=junit.xml",
        "-o",
        "junit_logging=system-out",
    )
    result.assert_outcomes(passed=2)
    return project.path


def drawn(report: Path) -> list[Path]:
    return sorted(p for p in report.iterdir() if p.suffix in (".png", ".svg"))


def test_every_unhealthy_run_has_valid_png_and_svg_pictures(out: Path) -> None:
    files = drawn(out / "report")
    names = {p.name.split("-", 1)[0] + "." + ".".join(p.name.rsplit(".", 2)[-2:]) for p in files}
    assert names == {
        "test_silent.py_test_dead.gradient-flow.png",
        "test_silent.py_test_dead.gradient-flow.svg",
        "test_silent.py_test_dead.loss.png",
        "test_silent.py_test_dead.loss.svg",
        "test_silent.py_test_dead.update-ratio.png",
        "test_silent.py_test_dead.update-ratio.svg",
    }  # the healthy run has none: pictures are for unhealthy runs unless asked
    for path in files:
        payload = path.read_bytes()
        if path.suffix == ".png":
            assert payload.startswith(b"\x89PNG\r\n\x1a\n") and payload[12:16] == b"IHDR"
        else:
            assert ET.fromstring(payload).tag == "{http://www.w3.org/2000/svg}svg"


def test_each_pictures_data_is_the_runs_history(out: Path) -> None:
    trace = json.loads((out / "report" / "test_silent.py_test_dead.json").read_text("utf-8"))
    for path in drawn(out / "report"):
        data = pictures.embedded(path.read_bytes())
        if data["picture"] == "loss":  # the loss recorded from the backward pass
            assert data["loss"] == [[int(s), v] for s, v in trace["history"]["loss"][""]]
            continue
        metric = {"gradient-flow": "grad_norm", "update-ratio": "update_ratio"}[data["picture"]]
        assert data["metric"] == metric
        history = trace["history"][metric]
        assert data["layers"] == [layer for layer in trace["model"]["order"] if layer in history]
        for layer, row in zip(data["layers"], data["values"]):
            recorded = {int(s): v for s, v in history[layer]}
            for step, value in zip(data["steps"], row):
                assert value == recorded.get(step)
        assert (data["root"], data["onset"]) == ("3", 0)


def test_the_summary_links_the_pictures_and_the_html_report_holds_them(out: Path) -> None:
    summary = (out / "report" / "summary.md").read_text("utf-8")
    assert "![gradient-flow (png)](test_silent.py_test_dead-" in summary
    page = (out / "report" / "report.html").read_text("utf-8")
    html.parser.HTMLParser().feed(page)  # parses
    assert page.count("data:image/svg+xml;base64,") == 3
    assert "Content-Security-Policy" in page and "<script" not in page
    assert "Dead neurons in &#x27;3&#x27; (ReLU)" in page and "class='node root'" in page


def test_the_junit_cases_attach_the_pictures_as_gitlab_reads_them(out: Path) -> None:
    health = junit_cases(out / "health.xml")["test_silent.py::test_dead::dead_neurons"]
    output = health.find("system-out")
    assert output is not None and "[[ATTACHMENT|report/test_silent.py_test_dead-" in (output.text or "")
    case = junit_cases(out / "junit.xml")["test_silent::test_dead"]
    assert case.find("failure") is None  # the test passed: pytest writes no output for it
    assert all("flowchart" not in (p.get("value") or "") for p in case.iter("property"))


def test_without_matplotlib_the_reports_say_how_to_get_pictures(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pictures, "available", lambda: False)
    project.makepyfile(test_silent=SILENT_TESTS)
    project.runpytest("--neuraldbg-report=report").assert_outcomes(passed=2)
    assert not drawn(project.path / "report")
    hint = 'pip install "pytest-neuraldbg[plots]"'
    assert hint.replace('"', "") in (project.path / "report" / "summary.md").read_text("utf-8").replace(
        "\\", ""
    ).replace('"', "")
    assert "pytest-neuraldbg[plots]" in (project.path / "report" / "report.html").read_text("utf-8")
