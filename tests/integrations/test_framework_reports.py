"""The pytest plugin with the framework callbacks: a test gives the callback the fixture's debugger
(``NeuralDbgCallback(neuraldbg(model))``), and the gate, the reports and the baselines see the run as they see a
plain loop. Inner pytest runs (pytester) of a small Lightning project and a small Hugging Face project.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest

# imported before the inner runs, which must not import them afresh (see conftest.py)
pytest.importorskip("lightning")
pytest.importorskip("transformers")

#: Two tests asserting nothing about training: a healthy classifier (with a baseline) and one whose head is left
#: out of configure_optimizers. LR (environment) sets the learning rate, to make a baseline regression.
LIGHTNING_PROJECT = """
import os

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from neuraldbg.integrations.lightning import NeuralDbgCallback


class Classifier(L.LightningModule):
    def __init__(self, train_head=True):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 2)
        self.train_head = train_head

    def forward(self, x):
        return self.head(self.net(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        params = self.parameters() if self.train_head else self.net.parameters()
        return torch.optim.Adam(params, lr=float(os.environ.get("LR", "1e-3")))


def fit(neuraldbg, tmp_path, model):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30 * 32, 16, generator=g)
    y = (x @ torch.randn(16, generator=g)).gt(0).long()
    trainer = L.Trainer(
        max_steps=30, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, callbacks=[NeuralDbgCallback(neuraldbg(model))],
    )
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=32))


@pytest.mark.neuraldbg(baseline=True)
def test_healthy(neuraldbg, tmp_path):
    torch.manual_seed(0)
    fit(neuraldbg, tmp_path, Classifier())


def test_left_out(neuraldbg, tmp_path):
    torch.manual_seed(0)
    fit(neuraldbg, tmp_path, Classifier(train_head=False))
"""

#: The same two tests with a tiny GPT-2 language model; the faulty one leaves the final LayerNorm out of its
#: user-supplied optimizer.
HUGGINGFACE_PROJECT = """
import os

import pytest
import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from neuraldbg.integrations.huggingface import NeuralDbgTrainerCallback


class Counting(Dataset):
    def __init__(self):
        start = torch.randint(0, 64, (320, 1), generator=torch.Generator().manual_seed(0))
        self.ids = (start + torch.arange(12)) % 64

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train(neuraldbg, tmp_path, left_out=()):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_embd=64, n_layer=2, n_head=2, n_positions=12, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    lr = float(os.environ.get("LR", "1e-3"))
    params = [p for name, p in model.named_parameters() if not name.startswith(left_out or "-")]
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=20, per_device_train_batch_size=16, learning_rate=lr, report_to=[],
        save_strategy="no", use_cpu=True, disable_tqdm=True,
    )
    callback = NeuralDbgTrainerCallback(neuraldbg(model))
    optimizers = (torch.optim.AdamW(params, lr=lr), None)
    Trainer(model=model, args=args, train_dataset=Counting(), callbacks=[callback], optimizers=optimizers).train()


@pytest.mark.neuraldbg(baseline=True)
def test_healthy(neuraldbg, tmp_path):
    train(neuraldbg, tmp_path)


def test_left_out(neuraldbg, tmp_path):
    train(neuraldbg, tmp_path, left_out="transformer.ln_f")
"""

PROJECTS = [
    pytest.param((LIGHTNING_PROJECT, "head", 30), id="lightning"),
    pytest.param((HUGGINGFACE_PROJECT, "transformer.ln_f", 20), id="huggingface"),
]


@pytest.fixture(autouse=True)
def _no_neuraldbg_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Inner runs must not see NEURALDBG_* variables or CI markers of the shell that runs this suite."""
    for name in list(os.environ):
        if name.startswith("NEURALDBG_") or name in ("CI", "BUILD_NUMBER"):
            monkeypatch.delenv(name)
    yield


def junit_properties(path: os.PathLike[str] | str) -> dict[str, dict[str, str]]:
    """Test name -> its JUnit properties."""
    cases = ET.parse(path).getroot().iter("testcase")
    return {c.get("name", ""): {p.get("name", ""): p.get("value", "") for p in c.iter("property")} for c in cases}


@pytest.mark.parametrize("project", PROJECTS)
def test_the_gate_reports_and_baselines_see_runs_watched_by_a_callback(
    project: tuple[str, str, int], pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, layer, steps = project
    pytester.makepyfile(test_project=source)

    # 1. write the healthy test's baseline
    pytester.runpytest("--neuraldbg-update-baselines").assert_outcomes(passed=2)
    assert (pytester.path / "__neuraldbg__" / "test_project" / "test_healthy.json").is_file()

    # 2. the gate fails the faulty run only; the reports name its layer and step
    result = pytester.runpytest("--neuraldbg-gate", "--neuraldbg-report=report", "--junitxml=junit.xml")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [f"NeuralDBG gate: training is unhealthy - frozen_parameters at '{layer}' from step 0 (confidence *)"]
    )
    result.stdout.fnmatch_lines(["FAILED test_project.py::test_left_out - NeuralDBG gate: training is unhealthy*"])
    summary = (pytester.path / "report" / "summary.md").read_text(encoding="utf-8")
    escaped = layer.replace("_", "\\_")
    rows = {line.split("`")[1]: line for line in summary.splitlines() if line.startswith("| `test_project.py::")}
    healthy, left_out = rows["test_project.py::test_healthy"], rows["test_project.py::test_left_out"]
    assert healthy.startswith("| `test_project.py::test_healthy` | passed | ✅ healthy |")
    assert healthy.endswith("| - | - | - | ✅ matched |")
    assert f"- ✅ `test_project.py::test_healthy`: {steps} steps, " in summary
    assert left_out.startswith("| `test_project.py::test_left_out` | **failed** | ❌ unhealthy |")
    assert f"| frozen\\_parameters | `{layer}` | 0 |" in left_out
    assert f"**frozen\\_parameters at '{escaped}' from step 0" in summary
    properties = junit_properties(pytester.path / "junit.xml")
    assert properties["test_healthy"]["neuraldbg.verdict"] == "healthy"
    assert properties["test_left_out"]["neuraldbg.verdict"] == "unhealthy"

    # 3. a learning rate 100x smaller fails the healthy test's baseline
    monkeypatch.setenv("LR", "1e-5")
    result = pytester.runpytest("-ra")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["NeuralDBG baseline regression: update_ratio at '*' *x smaller at * (step *) *"])
    result.stdout.fnmatch_lines(["FAILED test_project.py::test_healthy - Failed: NeuralDBG baseline regression*"])
