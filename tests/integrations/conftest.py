"""Shared set-up of the framework integration tests (Lightning, Hugging Face): nothing is trained when the suite is
collected; the ``frameworks_loaded`` session fixture does its work before the first test of this folder runs.

What it protects: pytester unloads the modules an in-process run imported when that run ends, and a later import
makes new classes (a ``NeuralDbgCallback`` built on a Lightning ``Callback`` class the Trainer no longer knows,
``isinstance`` against a reloaded class), which then fails in whichever test runs next (as happened under ``-n 2``).
So the inner runs of ``test_framework_reports.py`` must find everything they import already imported: the
libraries, the callbacks (built on first use) and the engine's own lazy imports (one short watched step).

The frameworks are optional: each test module skips itself (``pytest.importorskip``) when its library is missing,
and the README's example files, which import theirs as a user's test file does, are not collected then.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util

import pytest

collect_ignore = [
    path
    for path, library in (
        ("test_readme_lightning_example.py", "lightning"),
        ("test_readme_huggingface_example.py", "transformers"),
    )
    if importlib.util.find_spec(library) is None  # finds the library without importing it
]


@pytest.fixture(scope="session", autouse=True)
def frameworks_loaded() -> None:
    """Import the frameworks that are installed and their callbacks, and load the engine's lazy imports, once per
    test process."""
    import torch

    import neuraldbg
    import neuraldbg.integrations.huggingface
    import neuraldbg.integrations.lightning
    import neuraldbg.integrations.pytorch_lightning
    import pytest_neuraldbg.smoke
    import pytest_neuraldbg.watched  # noqa: F401

    for library, callbacks, name in (
        ("lightning.pytorch", neuraldbg.integrations.lightning, "NeuralDbgCallback"),
        ("pytorch_lightning", neuraldbg.integrations.pytorch_lightning, "NeuralDbgCallback"),
        ("transformers", neuraldbg.integrations.huggingface, "NeuralDbgTrainerCallback"),
    ):
        with contextlib.suppress(ImportError):
            importlib.import_module(library)
            assert getattr(callbacks, name)  # built now, on the library's classes of this process
    with contextlib.suppress(ImportError):
        import transformers

        assert transformers.TrainerCallback

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    optimizer = torch.optim.Adam(model.parameters())
    with neuraldbg.NeuralDbg(model) as dbg:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(torch.ones(4, 2)), torch.zeros(4, 1)).backward()
        optimizer.step()
    dbg.export_mermaid_causal_graph()
    dbg.to_dict()
    dbg.report()
