"""Without matplotlib (the optional ``plots`` extra) nothing breaks: the plugin's reports, ``neuraldbg report`` and
``neuraldbg explain`` work and say how to get pictures, and only ``neuraldbg demo --pictures`` refuses, as a usage
error. Checked in child processes in which importing matplotlib truly fails (``sys.modules['matplotlib'] = None``
is how Python marks a module as not importable), whatever this environment has installed."""

from __future__ import annotations

import html.parser
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from integration_support import SILENT_TESTS, junit_cases

HINT = 'pip install "pytest-neuraldbg[plots]"'

#: Imported by ``-p`` before any other plugin: from then on ``import matplotlib`` raises ImportError and
#: ``importlib.util.find_spec("matplotlib")`` is None, as when the package is not installed.
BLOCK = """
import sys

sys.modules["matplotlib"] = None
"""

NO_MATPLOTLIB_TEST = """
import importlib.util

import pytest


def test_matplotlib_cannot_be_imported_here():
    assert importlib.util.find_spec("matplotlib") is None
    with pytest.raises(ImportError):
        import matplotlib  # noqa: F401
"""


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``neuraldbg ARGS`` in a child process that cannot import matplotlib."""
    code = f"{BLOCK}\nfrom neuraldbg.cli import main\nsys.exit(main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("pictures", ["unhealthy", "all"])
def test_the_plugins_reports_are_whole_and_say_how_to_get_pictures(project: pytest.Pytester, pictures: str) -> None:
    project.makepyfile(block_matplotlib=BLOCK, test_silent=SILENT_TESTS, test_plain=NO_MATPLOTLIB_TEST)
    result = project.runpytest_subprocess(
        "-p",
        "block_matplotlib",
        "-p",
        "no:cacheprovider",
        "--neuraldbg-report=report",
        f"--neuraldbg-pictures={pictures}",
        "--neuraldbg-junit=health.xml",
        "--junitxml=junit.xml",
        "-o",
        "junit_logging=system-out",
        "-W",
        "error::neuraldbg.errors.NeuralDbgWarning",
    )
    result.assert_outcomes(passed=3)  # matplotlib truly missing, and no test broken by it
    report = project.path / "report"
    assert not [p for p in report.iterdir() if p.suffix in (".png", ".svg")]
    assert {"summary.md", "report.html"} <= {p.name for p in report.iterdir()}
    summary = (report / "summary.md").read_text("utf-8")
    assert "need matplotlib" in summary and "pytest-neuraldbg\\[plots\\]" in summary
    assert "UNHEALTHY" not in summary and "❌ unhealthy" in summary and "### ✅ Healthy runs" in summary
    page = (report / "report.html").read_text("utf-8")
    html.parser.HTMLParser().feed(page)
    assert "pytest-neuraldbg[plots]" in page and "class='node root'" in page and "<img" not in page
    health = junit_cases(project.path / "health.xml")
    assert "test_silent.py::test_dead::dead_neurons" in health
    for case in ET.parse(project.path / "junit.xml").getroot().iter("testcase"):
        assert "ATTACHMENT" not in ET.tostring(case, encoding="unicode")


def test_a_healthy_session_without_matplotlib_asks_for_nothing(project: pytest.Pytester) -> None:
    project.makepyfile(block_matplotlib=BLOCK, test_silent=SILENT_TESTS.split("def test_dead")[0])
    project.runpytest_subprocess("-p", "block_matplotlib", "--neuraldbg-report=report").assert_outcomes(passed=1)
    assert "matplotlib" not in (project.path / "report" / "summary.md").read_text("utf-8")


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the dead demo's trace, written by a child process without matplotlib."""
    folder = tmp_path_factory.mktemp("traces")
    done = cli(folder, "demo", "dead", "--no-graph", "--save", "dead.json")
    assert done.returncode == 0, done.stderr
    return folder


def test_neuraldbg_report_writes_the_page_and_says_how_to_get_pictures(traces: Path) -> None:
    done = cli(traces, "report", "dead.json", "-o", "report.html")
    assert done.returncode == 1, done.stderr  # the run is unhealthy: exit 1, as explain; not a crash (3)
    page = (traces / "report.html").read_text("utf-8")
    html.parser.HTMLParser().feed(page)
    assert HINT.replace('"', "&quot;") in page or HINT in page
    assert "<img" not in page and "class='node root'" in page


def test_neuraldbg_explain_needs_no_matplotlib(traces: Path) -> None:
    done = cli(traces, "explain", "dead.json")
    assert done.returncode == 1, done.stderr
    assert "UNHEALTHY" in done.stdout and "Traceback" not in done.stderr


def test_neuraldbg_demo_pictures_is_a_usage_error_naming_the_extra(tmp_path: Path) -> None:
    done = cli(tmp_path, "demo", "dead", "--no-graph", "--pictures", "pics")
    assert done.returncode == 2, done.stderr
    assert f"--pictures needs matplotlib: {HINT}" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "pics").exists()
