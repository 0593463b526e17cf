"""Shared set-up of the framework integration tests (Lightning, Hugging Face)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The models are tiny: one intra-op thread is faster, and much faster on a busy machine (a backward pass of
    the Lightning MLP took 33 ms with two threads competing for two loaded cores, 2 ms with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
