"""Rank 0's wait for the other ranks' summaries (``neuraldbg.distributed.gather``), on a fake store and a fake clock:
the wait is bounded by the timeout by construction, whatever the machine's speed, and stops as soon as every rank
has answered. The real two-process job is in ``tests/distributed/test_distributed_jobs.py``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from neuraldbg.distributed import gather
from neuraldbg.distributed.process import ProcessInfo


class FakeClock:
    """``time.monotonic`` and ``time.sleep`` for the module under test: sleeping only moves the clock."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


class FakeStore:
    """A key-value store whose other ranks answer on the ``arrive_at``-th poll of the counter (never: None)."""

    def __init__(self, summaries: dict[int, dict[str, Any]], arrive_at: int | None) -> None:
        self.summaries = summaries
        self.arrive_at = arrive_at
        self.polls = 0
        self.data: dict[str, bytes] = {}

    def add(self, key: str, amount: int) -> int:
        assert key.endswith("/count") and amount == 0  # rank 0 only reads the counter
        self.polls += 1
        if self.arrive_at is not None and self.polls >= self.arrive_at:
            base = key.rsplit("/", 1)[0]
            for rank, summary in self.summaries.items():
                self.data[f"{base}/{rank}"] = json.dumps({"summary": summary, "note": ""}).encode()
            return len(self.summaries)
        return 0

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]

    def delete_key(self, key: str) -> bool:
        return self.data.pop(key, None) is not None


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(gather, "time", fake)
    return fake


def rank_0(store: FakeStore, monkeypatch: pytest.MonkeyPatch, timeout: float) -> gather.Gathered:
    monkeypatch.setattr(gather, "default_store", lambda: store)
    out = gather.send({"findings": []}, timeout=timeout, info=ProcessInfo(0, 2, "gloo"))
    assert out is not None
    return out


def test_rank_0_stops_waiting_for_a_silent_rank_at_the_timeout_and_names_it(clock, monkeypatch) -> None:
    store = FakeStore({1: {"findings": []}}, arrive_at=None)
    out = rank_0(store, monkeypatch, timeout=2.0)
    assert out.reasons == {1: "sent no summary within 2 s (it failed, hung, or left its block later)"}
    assert set(out.summaries) == {0}
    assert sum(clock.sleeps) == pytest.approx(2.0)  # it slept exactly its timeout, in pauses...
    assert max(clock.sleeps) == pytest.approx(0.2)  # ...that grow to at most 0.2 s,
    assert store.polls == len(clock.sleeps) + 1  # polling the counter once per pause, and once more at the start
    assert out.seconds == pytest.approx(2.0)


def test_rank_0_stops_waiting_as_soon_as_every_rank_has_answered(clock, monkeypatch) -> None:
    store = FakeStore({1: {"findings": ["x"]}}, arrive_at=4)
    out = rank_0(store, monkeypatch, timeout=60.0)
    assert out.reasons == {} and out.summaries == {0: {"findings": []}, 1: {"findings": ["x"]}}
    assert store.polls == 4 and len(clock.sleeps) == 3  # no pause after the answer
    assert sum(clock.sleeps) == pytest.approx(0.005 + 0.01 + 0.02)
    assert store.data == {}  # rank 0 deleted what it read
