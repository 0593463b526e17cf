"""The optional extras: importing NeuralDBG never imports Lightning or transformers, and a callback used without its
library fails with one error that says what to install."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import neuraldbg.integrations.huggingface
import neuraldbg.integrations.lightning
import neuraldbg.integrations.pytorch_lightning
from neuraldbg.integrations import MissingExtraError

FRAMEWORKS = ("lightning", "pytorch_lightning", "transformers", "accelerate")


def test_importing_neuraldbg_the_plugin_and_the_integration_modules_imports_no_framework() -> None:
    code = (
        "import sys, neuraldbg, pytest_neuraldbg, pytest_neuraldbg.plugin, neuraldbg.integrations\n"
        "import neuraldbg.integrations.lightning, neuraldbg.integrations.pytorch_lightning\n"
        "import neuraldbg.integrations.huggingface\n"
        "neuraldbg.NeuralDbg  # the engine itself (torch) too\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "name", "missing", "install"),
    [
        (neuraldbg.integrations.lightning, "NeuralDbgCallback", "lightning", "pytest-neuraldbg[lightning]"),
        (neuraldbg.integrations.pytorch_lightning, "NeuralDbgCallback", "pytorch_lightning", "pytorch-lightning"),
        (
            neuraldbg.integrations.huggingface,
            "NeuralDbgTrainerCallback",
            "transformers",
            "pytest-neuraldbg[transformers]",
        ),
    ],
    ids=["lightning", "pytorch_lightning", "transformers"],
)
def test_a_callback_without_its_library_names_what_to_install(
    module: Any, name: str, missing: str, install: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for imported in [m for m in sys.modules if m.split(".")[0] == missing]:
        monkeypatch.setitem(sys.modules, imported, None)  # what an interpreter without the package sees
    monkeypatch.setitem(sys.modules, missing, None)
    monkeypatch.delitem(module.__dict__, name, raising=False)  # built and cached by earlier tests
    expected = (
        f"{name} needs the '{missing}' package, which is not installed; install it with: pip install \"{install}\""
    )
    with pytest.raises(MissingExtraError) as caught:
        getattr(module, name)
    assert str(caught.value) == expected
    assert isinstance(caught.value, ImportError)  # `except ImportError` keeps working
    with pytest.raises(ImportError, match="needs the"):
        exec(f"from {module.__name__} import {name}", {})


def test_a_name_the_integration_modules_do_not_have_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'LightningCallback'"):
        neuraldbg.integrations.lightning.LightningCallback  # noqa: B018
