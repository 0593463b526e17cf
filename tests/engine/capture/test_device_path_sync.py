"""A cheap step on the device path reads nothing back to the host: checked with CUDA's sync debug mode where a GPU
exists, and on the CPU by counting the calls that would synchronise a GPU (item, tolist, float, bool, ...)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "numpy")


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)
    ).to(device)


def _train(device: torch.device, around_cheap: Callable[[], Any], host_reads_are_free: bool) -> tuple[int, int]:
    """Train 64 steps under a debugger; steps 20 on that are cheap, and whose neighbours are cheap too (no flush
    can fall in them), run inside ``around_cheap()``. Returns (cheap steps checked, steps observed)."""
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(32, 16, generator=g).to(device), torch.randn(32, 4, generator=g).to(device)) for _ in range(8)]
    checked = 0
    with NeuralDbg(model) as dbg:
        rec = dbg._recorder
        rec.host_reads_are_free = host_reads_are_free
        for i in range(64):
            x, y = data[i % len(data)]
            step = rec.clock.step
            quiet = i >= 20 and not any(rec.schedule.is_full(s) for s in (step - 1, step, step + 1))
            with around_cheap() if quiet else _nothing():
                opt.zero_grad(set_to_none=True)
                F.mse_loss(model(x), y).backward()
                opt.step()
            checked += quiet
    return checked, dbg.steps


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cheap_cuda_step_makes_no_host_sync():
    @contextmanager
    def no_sync() -> Iterator[None]:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")

    checked, steps = _train(torch.device("cuda"), no_sync, host_reads_are_free=False)
    assert steps == 64
    assert checked >= 10


def test_a_cheap_step_on_the_device_path_reads_nothing_to_the_host(monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []
    counting = [False]
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: Any, _name: str = name, _original: Any = original) -> Any:
            if counting[0]:
                calls.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)

    @contextmanager
    def count() -> Iterator[None]:
        counting[0] = True
        try:
            yield
        finally:
            counting[0] = False

    checked, steps = _train(torch.device("cpu"), count, host_reads_are_free=False)
    assert steps == 64 and checked >= 10
    assert calls == []


def test_the_read_counter_sees_the_cpu_fast_paths_reads(monkeypatch: pytest.MonkeyPatch):
    """The counter above can fail: on the CPU fast path (host reads are free) a cheap step reads its output norm and
    the head gradient probe back at once."""
    calls: list[str] = []
    counting = [False]
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: Any, _name: str = name, _original: Any = original) -> Any:
            if counting[0]:
                calls.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)

    @contextmanager
    def count() -> Iterator[None]:
        counting[0] = True
        try:
            yield
        finally:
            counting[0] = False

    checked, _ = _train(torch.device("cpu"), count, host_reads_are_free=True)
    assert checked >= 10
    assert len(calls) >= checked
