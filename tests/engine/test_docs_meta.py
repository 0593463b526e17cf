"""What the docs say ``dbg.meta`` holds is what it holds: the model class, steps observed and versions, and not the
configuration or the layers (those are ``dbg.config`` and ``dbg.layers``), for a live run and a loaded trace."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

import neuraldbg
from neuraldbg import NeuralDbg

ROOT = Path(__file__).resolve().parents[2]


def meta_rows() -> list[str]:
    """Every table row of the README and docs/ that describes ``dbg.meta``."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [line for page in pages for line in page.read_text("utf-8").splitlines() if line.startswith("| `dbg.meta`")]


def test_the_documented_contents_of_meta_are_true(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model) as dbg:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
    rows = meta_rows()
    assert rows, "no row of the docs describes dbg.meta"
    for run in (dbg, neuraldbg.load(dbg.save(tmp_path / "run.json"))):
        meta = run.meta
        assert meta["model"] == "Sequential" and meta["steps_observed"] == 3
        assert meta["torch_version"] == str(torch.__version__) and re.fullmatch(
            r"3\.\d+\.\d+.*", meta["python_version"]
        )
        assert "config" not in meta and "layers" not in meta
        assert run.layers == ["0", "1", "2"] and run.config.as_dict()
    for row in rows:
        what = row.split("|")[2]
        # the row names the configuration and the layers only as what is elsewhere
        assert "configuration, layers" not in what
        assert "`dbg.config`" in what and "`dbg.layers`" in what
