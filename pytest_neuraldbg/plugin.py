"""pytest entry point (``pytest11``). Imports no torch at import time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def neuraldbg() -> Iterator[Any]:
    """Wrap a training loop: ``with neuraldbg(model) as ndbg: ...``."""
    from neuraldbg import NeuralDbg

    yield NeuralDbg
