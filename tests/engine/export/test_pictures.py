"""Pictures of a run and the HTML report, engine side: reproducible files whose data is the run's history, and the
CLI commands that write them."""

from __future__ import annotations

import html.parser
import math
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, load
from neuraldbg.export import html as html_report
from neuraldbg.export import pictures

pytest.importorskip("matplotlib")


def dead_run(steps: int = 24) -> NeuralDbg:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    with torch.no_grad():
        model[2].bias.fill_(-20.0)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(model) as dbg:
        for _ in range(steps):
            opt.zero_grad()
            loss = F.mse_loss(model(torch.randn(16, 8, generator=g)), torch.randn(16, 1, generator=g))
            dbg.observe_loss(loss)
            loss.backward()
            opt.step()
    return dbg


@pytest.fixture(scope="module")
def run() -> NeuralDbg:
    return dead_run()


def test_a_run_has_three_pictures_in_two_formats_drawn_the_same_every_time(run: NeuralDbg, tmp_path: Path) -> None:
    first = pictures.draw(run, tmp_path / "a", "run")
    second = pictures.draw(run, tmp_path / "b", "run")
    assert [p.name for p in first] == [
        f"run.{name}.{fmt}" for name in ("gradient-flow", "loss", "update-ratio") for fmt in ("png", "svg")
    ]
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]  # reproducible, byte for byte
    for path in first:
        payload = path.read_bytes()
        if path.suffix == ".png":
            assert payload.startswith(b"\x89PNG\r\n\x1a\n")
        else:
            assert ET.fromstring(payload).tag.endswith("svg") and b"<dc:date>" not in payload


def test_the_data_of_each_picture_is_the_runs_history(run: NeuralDbg, tmp_path: Path) -> None:
    files = {p.name.split(".")[1] + p.suffix: p for p in pictures.draw(run, tmp_path, "run")}
    loss = pictures.embedded(files["loss.png"].read_bytes())
    assert loss["loss"] == [[s, v] for s, v in run.history.get("loss", "").points()]
    grads = pictures.embedded(files["gradient-flow.svg"].read_bytes())
    assert grads["layers"] == ["0", "2", "4"]  # forward order, the layers that have a gradient norm
    for layer, row in zip(grads["layers"], grads["values"]):
        recorded = dict(run.history.get("grad_norm", layer).points())
        assert row == [recorded.get(step) for step in grads["steps"]]
    assert (grads["root"], grads["onset"]) == ("3", 0)


def test_a_trace_draws_the_same_pictures_as_the_live_run(run: NeuralDbg, tmp_path: Path) -> None:
    live = pictures.draw(run, tmp_path / "live", "run")
    loaded = pictures.draw(load(run.save(tmp_path / "run.json")), tmp_path / "loaded", "run")
    assert [p.read_bytes() for p in live] == [p.read_bytes() for p in loaded]


def test_a_wide_model_is_cut_to_the_rows_a_picture_can_show_keeping_the_root() -> None:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(80):
        layers += [nn.Linear(4, 4), nn.Tanh()]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model) as dbg:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 4)).sum().backward()
            opt.step()
    found = pictures.grid(dbg, "grad_norm", root="78")
    assert found is not None and len(found.layers) <= pictures.MAX_ROWS + 1 and "78" in found.layers
    assert found.layers[0] == "0" and found.layers[-1] == "158"


def test_the_html_report_parses_and_holds_verdicts_pictures_and_a_graph(run: NeuralDbg) -> None:
    page = html_report.page([html_report.run_page(run, "dead <b>run</b>")])
    html.parser.HTMLParser().feed(page)
    assert "dead &lt;b&gt;run&lt;/b&gt;" in page and "<b>run</b>" not in page
    assert page.count("data:image/svg+xml;base64,") == 3
    assert "class='node root'" in page and "zeroes the gradient of →" in page


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "neuraldbg.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_neuraldbg_report_writes_one_html_file_of_several_traces(run: NeuralDbg, tmp_path: Path) -> None:
    run.save(tmp_path / "a.json")
    run.save(tmp_path / "b.json")
    done = cli("report", "a.json", "b.json", "-o", "out/report.html", cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # an unhealthy run: exit 1, as explain
    page = (tmp_path / "out" / "report.html").read_text("utf-8")
    html.parser.HTMLParser().feed(page)
    assert page.count("<h2 id=") == 2


def test_neuraldbg_explain_on_a_report_folder_explains_each_run(run: NeuralDbg, tmp_path: Path) -> None:
    folder = tmp_path / "report"
    run.save(folder / "t.py_test_a.json")
    run.save(folder / "t.py_test_b.json")
    (folder / "summary.md").write_text("## summary\n", "utf-8")
    done = cli("explain", "report", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stdout.count("=== report/t.py_test_") == 2 and "UNHEALTHY" in done.stdout


def test_the_demo_draws_its_pictures_where_asked(tmp_path: Path) -> None:
    done = cli("demo", "dead", "--no-graph", "--pictures", "pics", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "pics").iterdir()) == [
        "demo-dead.gradient-flow.png",
        "demo-dead.gradient-flow.svg",
        "demo-dead.loss.png",
        "demo-dead.loss.svg",
        "demo-dead.update-ratio.png",
        "demo-dead.update-ratio.svg",
    ]


def test_the_docs_picture_is_what_its_documented_command_draws(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[3]
    command = "neuraldbg demo dead --no-graph --pictures docs/images"
    assert command in (root / "docs" / "plugin.md").read_text("utf-8")
    assert "](images/demo-dead.gradient-flow.png)" in (root / "docs" / "plugin.md").read_text("utf-8")
    done = cli(*command.split()[1:-1], str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for name in ("demo-dead.gradient-flow.png", "demo-dead.gradient-flow.svg"):
        committed = (root / "docs" / "images" / name).read_bytes()
        # the same data, to float32 rounding: the demo's training takes other kernels on another CPU (AVX2 and
        # AVX-512 sum in another order), which moves the last digits of its statistics
        assert _close(pictures.embedded(committed), pictures.embedded((tmp_path / name).read_bytes()))


def test_one_figure_gives_both_formats_and_an_unknown_format_is_named() -> None:
    points = [(0, 1.0), (1, 0.5), (2, 0.25)]
    both = pictures.render_formats("loss", points, pictures.Marks(), ("png", "svg"))
    assert both["png"].startswith(b"\x89PNG") and b"<svg" in both["svg"]
    assert both["png"] == pictures.render("loss", points, pictures.Marks(), "png")  # alone or together: the same
    assert both["svg"] == pictures.render("loss", points, pictures.Marks(), "svg")
    with pytest.raises(ValueError, match="'gif'"):
        pictures.render("loss", points, pictures.Marks(), "gif")


def _close(a: object, b: object) -> bool:
    """Equal structure and text, and numbers equal to a relative 1e-5 (float32 rounding of the same run)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-5)
    return a == b
