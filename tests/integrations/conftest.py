"""Shared set-up of the framework integration tests (Lightning, Hugging Face).

Everything the inner pytest runs of ``test_framework_reports.py`` import is imported here first: pytester unloads
the modules an in-process run imported when it ends, and a later import would make new classes and enums
(``isinstance`` against a reloaded ``NeuralDbg``, ``is`` against reloaded ``FailureKind`` members then fail in
whichever test runs next, as happens under ``-n 2``). A short watched step loads the engine's lazy imports too.
"""

from __future__ import annotations

from collections.abc import Iterator

import lightning.pytorch  # noqa: F401
import pytest
import pytorch_lightning  # noqa: F401
import torch
import transformers

import neuraldbg
import neuraldbg.integrations.huggingface
import neuraldbg.integrations.lightning
import pytest_neuraldbg.smoke
import pytest_neuraldbg.watched  # noqa: F401


def _warm_up() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    optimizer = torch.optim.Adam(model.parameters())
    with neuraldbg.NeuralDbg(model) as dbg:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(torch.ones(4, 2)), torch.zeros(4, 1)).backward()
        optimizer.step()
    dbg.export_mermaid_causal_graph()
    dbg.to_dict()
    dbg.report()
    assert neuraldbg.integrations.lightning.NeuralDbgCallback and transformers.TrainerCallback
    assert neuraldbg.integrations.huggingface.NeuralDbgTrainerCallback


_warm_up()


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The models are tiny: one intra-op thread is faster, and much faster on a busy machine (a backward pass of
    the Lightning MLP took 33 ms with two threads competing for two loaded cores, 2 ms with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
