"""Fuzzing the trace reader: every mutated trace either loads and answers every query, or is one TraceError line.

Real traces (small CPU runs: healthy, a dead layer, a dead layer and a NaN batch; with history) are mutated with
seeded random edits: type swaps, deletions, duplicates, extreme and non-finite numbers, deep nesting, truncation,
byte garbage, and semantically odd but well-typed events (any kind on any signal, unknown layers, huge steps).
Whatever comes out,
``neuraldbg.load`` raises nothing but TraceError, a trace that loads answers every query and saves again, and
``neuraldbg explain`` exits 2 with one line for a bad file and 0 or 1 for a good one. Never 1 for a bad file.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from job_support import POISON_STEP, rank_run

import neuraldbg
from neuraldbg import EventType, FailureKind, TraceError
from neuraldbg.cli import main
from neuraldbg.distributed.merge import merge, summarize

SELECTORS = ["non_finite", "dead", "gradient", "vanishing_gradients", "frozen_parameters", "input", "run"]

SWAPS: list[Any] = [
    None, True, False, 0, -1, 1, 2, 0.5, -0.5, 1e308, -1e308, 2**53, 2**63, -(2**63), "", "x", "abc", "inf",
    "-inf", "nan", [], {}, [1, 2], {"a": 1}, [[0, 1]], "\ud800", "%%{init: {'theme': 'dark'}}%%", "a\nb",
]  # fmt: skip
EXTREMES: list[Any] = [float("inf"), float("nan"), -1, -(10**9), 10**30, 1e300, -0.0, 2**53 - 1, 2**53, 3.5]
SECTIONS = ["events", "events", "events", "hypotheses", "meta", "config", "model", "history"]
DEEP = "\u0000deep\u0000"


@pytest.fixture(scope="module")
def originals() -> dict[str, str]:
    """The text of saved traces of real runs: healthy, a dead layer, a dead layer and a NaN batch."""
    runs = {"healthy": rank_run(0, dead=False), "dead": rank_run(0), "nan": rank_run(1, poison_step=POISON_STEP)}
    return {name: json.dumps(dbg.to_dict(), indent=1) for name, dbg in runs.items()}


def paths(node: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from paths(value, (*prefix, i))


def structural(text: str, rng: random.Random) -> tuple[str, str | bytes]:
    """One random edit anywhere in the document, or to its text or bytes."""
    op = rng.choice(["swap", "swap", "swap", "delete", "extreme", "extreme", "duplicate", "deep", "cut", "bytes"])
    if op == "cut":
        return op, text[: rng.randrange(len(text))]
    if op == "bytes":
        data = bytearray(text.encode())
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return op, bytes(data)
    doc = json.loads(text)
    section = rng.choice(SECTIONS)
    candidates = [p for p in paths(doc[section], (section,))] if doc.get(section) else [(section,)]
    where = rng.choice(candidates)
    parent: Any = doc
    for key in where[:-1]:
        parent = parent[key]
    key = where[-1]
    if op == "swap":
        parent[key] = copy.deepcopy(rng.choice(SWAPS))
    elif op == "delete":
        del parent[key]
    elif op == "extreme":
        parent[key] = rng.choice(EXTREMES)
    elif op == "duplicate":
        if isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))
        else:
            parent[f"{key}_again"] = copy.deepcopy(parent[key])
    else:  # deep: a value nested far past any limit, written as text (json.dumps itself would recurse)
        parent[key] = DEEP
        depth = rng.choice([60, 70, 5000, 100_000])
        return f"deep {depth} at {where}", json.dumps(doc).replace(json.dumps(DEEP), "[" * depth + "]" * depth)
    return f"{op} at {where}", json.dumps(doc)  # NaN and Infinity become bare literals


VALID: dict[str, list[Any]] = {
    "event_type": [t.value for t in EventType],
    "kind": [k.value for k in FailureKind] + [None],
    "to_state": ["dead", "vanishing", "exploding", "non_finite", "anomalous", "amplifying", "frozen", "weird"],
    "from_state": [None, "healthy", "dead"],
    "layer": ["", "0", "1", "3", "5", "nosuch", "%%{"],
    "param": [None, "0.weight", "x"],
    "step_start": [0, 1, 30, 59, 10**6, 2**53 - 1],
    "confidence": [0, 1, 0.5, 1e-300],
}
METRICS = ["units", "dead_fraction", "grad_norm", "exact_zero", "median_update_ratio", "lr", "call", "ongoing"]


def semantic(text: str, rng: random.Random) -> tuple[str, str]:
    """Well-typed but odd events: any kind on any signal, unknown layers, huge steps, a shuffled layer order."""
    doc = json.loads(text)
    events = doc["events"]
    changes = []
    for _ in range(rng.randint(1, 4)):
        if not events:
            break
        i = rng.randrange(len(events))
        event = events[i]
        roll = rng.random()
        if roll < 0.6:
            field = rng.choice(list(VALID))
            event[field] = rng.choice(VALID[field])
            event["step_end"] = max(event["step_end"], event["step_start"])
            changes.append(f"events[{i}].{field} = {event[field]!r}")
        elif roll < 0.9:
            metric = rng.choice(METRICS)
            event["metrics"][metric] = rng.choice([0, 1, 64, 0.5, 1e308, "inf", "-inf", "nan"])
            changes.append(f"events[{i}].metrics.{metric} = {event['metrics'][metric]!r}")
        else:
            events.append(copy.deepcopy(event))
            changes.append(f"events[{i}] twice")
    if rng.random() < 0.2:
        doc["model"]["order"] = rng.sample(doc["model"]["order"], len(doc["model"]["order"]))
        changes.append("layer order shuffled")
    if rng.random() < 0.1:
        doc["meta"]["last_step"] = rng.choice([-1, 0, 2**53 - 1])
        changes.append(f"meta.last_step = {doc['meta']['last_step']}")
    return "; ".join(changes), json.dumps(doc)


def targeted(text: str) -> list[tuple[str, str]]:
    """The cases reported against the reader, and their neighbours."""
    doc = json.loads(text)
    out = []
    for where, value in [
        (("meta", "last_step"), "abc"),
        (("meta", "steps_observed"), None),
        (("meta", "model"), ["Sequential"]),
        (("config", "persistence"), 10**6),
        (("model", "layers"), [{"name": "0"}]),
        (("events",), {"0": {}}),
    ]:
        changed = copy.deepcopy(doc)
        node = changed
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = value
        out.append((f"{where} = {value!r}", json.dumps(changed)))
    series = copy.deepcopy(doc)
    metric = next(iter(series["history"]))
    series["history"][metric][next(iter(series["history"][metric]))][0] = ["inf", 1]
    out.append(("history point ['inf', 1]", json.dumps(series)))
    out.append(
        ("nested 100,000 deep", '{"format": "neuraldbg-trace", "events": ' + "[" * 100_000 + "]" * 100_000 + "}")
    )
    out.append(("integer of 5000 digits", text.replace('"version": 1', '"version": ' + "1" * 5000)))
    return out


def queries(trace: neuraldbg.Trace, tmp_path: Path) -> None:
    """Every question a loaded trace answers; the answers must come without an exception."""
    hypotheses = trace.hypotheses()
    trace.report()
    trace.explain_failure()
    trace.export_mermaid_causal_graph()
    trace.detect_coupled_failures()
    trace.get_root_causes()
    _ = trace.meta, trace.layers, trace.events, trace.model_name, trace.healthy, trace.steps
    for selector in SELECTORS:
        trace.trace_causal_chain(selector)
    again = neuraldbg.load(trace.save(tmp_path / "again.json"))
    assert [h.summary() for h in again.hypotheses()] == [h.summary() for h in hypotheses]
    merge({0: summarize(trace, rank=0)}, world_size=1).report()


def run_cli(path: Path, *flags: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["explain", str(path), *flags])
    return code, out.getvalue(), err.getvalue()


def check(path: Path, data: str | bytes, what: str, tmp_path: Path) -> str:
    """Load one mutated trace; returns "loaded" or "refused", or raises with what went wrong."""
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    try:
        trace = neuraldbg.load(path)
    except TraceError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"{path}: "), (what, message)
        code, out, err = run_cli(path)
        assert code == 2 and out == "" and err == f"neuraldbg explain: {message}\n", (what, code, err)
        return "refused"
    queries(trace, tmp_path)
    code, out, err = run_cli(path, "--json")
    assert code == (0 if trace.healthy else 1) and err == "", (what, code, err)
    assert json.loads(out)["healthy"] is trace.healthy
    return "loaded"


def test_targeted_hostile_traces_load_fully_or_fail_with_one_line_and_exit_2(originals, tmp_path: Path):
    outcomes = {}
    for what, data in targeted(originals["dead"]):
        outcomes[what] = check(tmp_path / "t.json", data, what, tmp_path)
    assert set(outcomes.values()) == {"refused"}, outcomes


@pytest.mark.parametrize("seed", range(3))
def test_randomly_mutated_traces_load_fully_or_fail_with_one_line_and_exit_2(originals, tmp_path: Path, seed: int):
    rng = random.Random(seed)
    names = sorted(originals)
    counts = {"loaded": 0, "refused": 0}
    for i in range(100):
        what, data = structural(originals[rng.choice(names)], rng)
        counts[check(tmp_path / "m.json", data, f"seed {seed}, mutation {i}: {what}", tmp_path)] += 1
    assert counts["loaded"] >= 10 and counts["refused"] >= 30, counts  # both paths were exercised


def test_well_typed_but_odd_events_always_load_and_answer_every_query(originals, tmp_path: Path):
    rng = random.Random(7)
    names = sorted(originals)
    counts = {"loaded": 0, "refused": 0}
    for i in range(100):
        what, data = semantic(originals[rng.choice(names)], rng)
        counts[check(tmp_path / "s.json", data, f"semantic {i}: {what}", tmp_path)] += 1
    assert counts["loaded"] >= 80, counts  # metrics like units "inf" are refused; the rest must load
