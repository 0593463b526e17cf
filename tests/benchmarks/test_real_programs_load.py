"""The real-programs benchmark loads as CI's benchmark job runs it: every program imports, every case it defines
has its stored plain-torch ground truth, the kinds a variant accepts are the ones stored with it, and the kinds the
benchmark knows are the engine's own (a kind added to the engine and accepted by a case is known to both)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.real import core
from benchmarks.real.programs import cases
from neuraldbg.kinds import BUILTIN

TRUTH = Path(__file__).resolve().parents[2] / "benchmarks" / "real" / "ground_truth.json"


def test_every_case_loads_and_has_its_stored_ground_truth_with_the_same_acceptable_kinds():
    stored = json.loads(TRUTH.read_text())["cases"]
    defined = cases()
    assert {case.id for case in defined} == set(stored)
    for case in defined:
        assert set(stored[case.id]["hand_kinds"]) == set(case.variant.kinds), case.id
        assert set(case.variant.kinds) <= set(stored[case.id]["kinds"]) or not stored[case.id]["harmful"], case.id


def test_the_benchmark_knows_exactly_the_engines_kinds():
    assert {room.name for room in BUILTIN} == set(core.KINDS)
