"""Names that act on a terminal or an encoder (ESC sequences, bidirectional overrides, lone surrogates, huge names)
are inert in every output meant for people: the CLI, reports, Mermaid graphs."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.export.inert import inert

FAKE = "\x1b[1A\x1b[2KNeuralDBG: healthy\u202e"


def dead_run(relu: str, head: str = "fc2", steps: int = 12) -> NeuralDbg:
    torch.manual_seed(0)
    model = nn.Sequential(
        collections.OrderedDict([("fc1", nn.Linear(8, 16)), (relu, nn.ReLU()), (head, nn.Linear(16, 1))])
    )
    with torch.no_grad():
        model.fc1.bias.fill_(-20.0)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    with NeuralDbg(model) as dbg:
        for _ in range(steps):
            opt.zero_grad()
            F.mse_loss(model(torch.randn(16, 8)), torch.randn(16, 1)).backward()
            opt.step()
    return dbg


def test_inert_escapes_controls_bidi_and_surrogates_and_nothing_else() -> None:
    assert inert("fc1 ü→β 😀 (ReLU)") == "fc1 ü→β 😀 (ReLU)"
    assert inert("a\x1b[2Kb\u202ec\udc80d\te\nf") == "a\\x1b[2Kb\\u202ec\\udc80d\\x09e\\x0af"
    assert inert("line\nnext", lines=True) == "line\nnext"


def test_explain_on_a_crafted_trace_prints_no_escape_sequence(tmp_path: Path) -> None:
    path = dead_run(FAKE, "fc\udc80").save(tmp_path / "evil.json")
    for extra in ([], ["--mermaid"], ["--json"]):
        out = subprocess.run(
            [sys.executable, "-m", "neuraldbg.cli", "explain", path, *extra], capture_output=True, timeout=120
        )
        assert out.returncode == 1, out.stderr
        assert b"\x1b" not in out.stdout and "\u202e".encode() not in out.stdout
        assert b"\\x1b[1A" in out.stdout or b"\\u001b[1A" in out.stdout  # the name, recognisable
    text = subprocess.run(
        [sys.executable, "-m", "neuraldbg.cli", "explain", path], capture_output=True, text=True, timeout=120
    ).stdout
    assert not any(line.startswith("NeuralDBG: healthy") for line in text.splitlines())


def test_a_graph_renders_whatever_the_length_of_a_name() -> None:
    graph = dead_run("r" * 30_000).export_mermaid_causal_graph()
    assert len(graph) < 5_000
    mermaidx = pytest.importorskip("mermaidx")
    assert "<svg" in mermaidx.render(graph).svg()
