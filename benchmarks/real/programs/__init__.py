"""The programs of the benchmark, one module per family (or two close families)."""

from __future__ import annotations

import importlib

from ..core import Case, Program

MODULES = (
    "classification",
    "language_model",
    "translation",
    "generative",
    "image_to_image",
    "graph",
    "reinforcement",
    "forward_forward",
    "siamese",
    "time_series",
    "hf_text",
    "hf_vision",
    "frameworks",
    "tabular",
)


def programs() -> list[Program]:
    found: list[Program] = []
    for name in MODULES:
        found.extend(importlib.import_module(f"{__name__}.{name}").PROGRAMS)
    return found


def cases() -> list[Case]:
    return [Case(program, variant) for program in programs() for variant in program.variants]


def case(case_id: str) -> Case:
    for c in cases():
        if c.id == case_id:
            return c
    raise KeyError(f"no case {case_id!r}")
