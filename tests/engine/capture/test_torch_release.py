"""The oldest torch NeuralDBG runs on: the engine refuses an older one at import with the way out, and
pyproject.toml asks pip for the same floor."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from neuraldbg.capture import hooks

ROOT = Path(__file__).resolve().parents[3]
OLDEST = ".".join(map(str, hooks.OLDEST_TORCH))


@pytest.mark.parametrize(
    ("version", "release"),
    [("2.9.1+cu128", (2, 9)), ("2.13.0+cpu", (2, 13)), ("2.10.0a0+git1234", (2, 10)), ("3.0", (3, 0)), ("dev", None)],
)
def test_a_torch_version_is_read_as_its_major_and_minor_release(version: str, release: tuple[int, int] | None) -> None:
    assert hooks.torch_release(version) == release


def test_an_older_torch_is_refused_naming_the_version_and_the_way_out() -> None:
    with pytest.raises(ImportError) as raised:
        hooks.require_torch("2.6.0+cu124")
    message = str(raised.value)
    assert f"NeuralDBG needs torch {OLDEST} or later" in message
    assert "'2.6.0+cu124'" in message and "torch.__version__" in message and f"pip install 'torch>={OLDEST}'" in message


@pytest.mark.parametrize("version", ["2.8.0", "2.8.0+cu128", "2.9.1+cu128", "2.13.0+cpu", "2.15.0", "3.1.0", "nightly"])
def test_the_oldest_supported_torch_and_anything_newer_or_unreadable_are_let_through(version: str) -> None:
    hooks.require_torch(version)


def test_this_torch_is_supported() -> None:
    assert hooks.torch_release(str(torch.__version__)) >= hooks.OLDEST_TORCH


def test_pip_is_asked_for_the_same_floor() -> None:
    found = re.search(r'"torch>=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert found is not None
    assert (int(found[1]), int(found[2])) == hooks.OLDEST_TORCH


def test_importing_the_engine_under_an_older_torch_fails_with_that_message() -> None:
    code = "import torch; torch.__version__ = '2.1.2+cu121'; import neuraldbg; neuraldbg.NeuralDbg"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode != 0
    assert f"NeuralDBG needs torch {OLDEST} or later, and torch.__version__ is '2.1.2+cu121'" in done.stderr
