"""Helpers shared by the Lightning and Hugging Face tests: what a debugger concluded, and what a logger emitted."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def summaries(dbg: Any) -> list[tuple[str, str, int]]:
    """(kind, root layer, onset step) of each hypothesis, most likely first."""
    return [(h.kind.value, h.root.layer, h.root.step_start) for h in dbg.hypotheses()]


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def records_of(name: str, level: int | None = None) -> Iterator[list[logging.LogRecord]]:
    """The records logged to ``name`` (with the logger set to ``level``, when given) while the block runs, whatever
    its ancestors do with records (Lightning may stop propagation at ``lightning.pytorch``; transformers sets its
    own levels)."""
    logger = logging.getLogger(name)
    keep, old_level = _Keep(), logger.level
    logger.addHandler(keep)
    if level is not None:
        logger.setLevel(level)
    try:
        yield keep.records
    finally:
        logger.removeHandler(keep)
        logger.setLevel(old_level)
