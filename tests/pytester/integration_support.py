"""Helpers of the integration tests: the inner tests' models, JUnit readers, a Mermaid check."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

#: Written as ``models.py`` next to the inner tests: a healthy MLP, the same MLP with a dead ReLU ('3': its
#: input layer '2' has bias -20, so every unit is inactive from step 0), and a few fixed batches.
MODELS = '''
import torch
import torch.nn.functional as F
from torch import nn

loss = F.mse_loss


def mlp(width=16, in_features=8):
    return nn.Sequential(
        nn.Linear(in_features, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
    )


def healthy():
    torch.manual_seed(0)
    return mlp()


def dead():
    torch.manual_seed(0)
    model = mlp()
    with torch.no_grad():
        model[2].bias.fill_(-20.0)
    return model


def data(n=4, batch=16, in_features=8):
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(in_features, 1, generator=g)
    batches = []
    for _ in range(n):
        x = torch.randn(batch, in_features, generator=g)
        batches.append((x, x @ teacher))
    return batches


def loop(ndbg_factory, model, steps=30):
    """A hand-written training loop under the fixture's debugger."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = data()
    with ndbg_factory(model) as ndbg:
        for step in range(steps):
            x, y = batches[step % len(batches)]
            opt.zero_grad()
            loss(model(x), y).backward()
            opt.step()
    return ndbg
'''

#: A healthy and a dead-ReLU test that assert nothing about training: only reports and the gate judge them.
SILENT_TESTS = """
import models


def test_healthy(neuraldbg):
    neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=30)


def test_dead(neuraldbg):
    models.loop(neuraldbg, models.dead())
"""


def junit_cases(path: Path) -> dict[str, ET.Element]:
    """``<testcase>`` elements by ``classname::name`` (pytest's own JUnit) or ``classname/name``."""
    root = ET.parse(path).getroot()
    return {f"{c.get('classname')}::{c.get('name')}": c for c in root.iter("testcase")}


def properties(case: ET.Element) -> list[tuple[str, str]]:
    """The ``(name, value)`` properties of a test case, in order."""
    return [(p.get("name", ""), p.get("value", "")) for p in case.iter("property")]


def render_mermaid(source: str) -> None:
    """Render with real Mermaid (mermaidx); a parse error raises RuntimeError."""
    mermaidx = pytest.importorskip("mermaidx")
    svg = mermaidx.render(source).svg()
    assert "<svg" in svg
