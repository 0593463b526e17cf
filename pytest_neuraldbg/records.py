"""A watched run as plain JSON data: what the reports need, computed once where the run happened.

A record crosses from an xdist worker to the controller on the test report, so it holds only strings,
numbers, lists and dicts (non-finite numbers as the strings ``"inf"``, ``"-inf"``, ``"nan"``, as in trace
files). The debugger is used through its public query API only; this module imports no torch.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict, cast

from neuraldbg.export.inert import encodable, encodable_data, inert, inert_data
from neuraldbg.text import json_number

HEALTHY = "healthy"
UNHEALTHY = "unhealthy"
ERROR = "error"


class EventRecord(TypedDict):
    """A :class:`~neuraldbg.SemanticEvent` as plain data, with its text and the link to its cause."""

    event_type: str
    kind: str | None
    layer: str
    param: str | None
    step_start: int
    step_end: int
    from_state: str | None
    to_state: str
    metrics: dict[str, float | str]  # non-finite numbers as "inf", "-inf", "nan"
    text: str
    where: str
    cause: str | None  # where the event that caused it held (None for the root and for joined events)
    relation: str | None


class _Hypothesis(TypedDict):
    kind: str
    confidence: float
    summary: str
    explanation: str
    suggestion: str
    layer: str
    step: int
    chain: list[EventRecord]


class HypothesisRecord(_Hypothesis, total=False):
    """A :class:`~neuraldbg.CausalHypothesis` as plain data; ``asserted``: an assertion helper of the test failed on
    it; ``ignored``: the test ignored its kind (``assert_healthy(ignore=...)``). Both set once the test's run is
    summarised."""

    asserted: bool
    ignored: bool


class ChartSeries(TypedDict):
    """One line of the gradient chart: a layer, its label, its ``[step, norm]`` points."""

    layer: str
    label: str
    points: list[list[float | str]]


class _Run(TypedDict):
    nodeid: str
    run: str
    steps: int
    hypotheses: list[HypothesisRecord]
    mermaid: str
    kinds: list[str]  # the failure kinds the run was checked for


class KeyNumbers(TypedDict, total=False):
    """A run in a few numbers: its final loss, and the smallest and largest gradient norm among its layers at the
    last step that recorded one (``[layer, norm]``)."""

    final_loss: float | str
    grad_step: int
    grad_min: list[str | float]
    grad_max: list[str | float]


class RunRecord(_Run, total=False):
    """One watched run of a test, as it crosses from an xdist worker to the controller."""

    verdict: str  # HEALTHY, UNHEALTHY or ERROR
    gate: str  # the test's gate: fail, warn or off
    numbers: KeyNumbers
    grad_chart: list[ChartSeries]
    pictures: list[str]  # the run's picture files, by name, in the report folder
    trace: dict[str, Any]  # the JSON trace, when the report folder keeps traces
    error: str  # why the run could not be summarised (verdict ERROR)


def where(event: Any) -> str:
    return str(event.where)


def event_dict(event: Any, coupling: Any = None) -> EventRecord:
    """A :class:`~neuraldbg.SemanticEvent` as plain data, plus ``text`` and the link to its cause."""
    return {
        "event_type": str(event.event_type.value),
        "kind": event.kind.value if event.kind is not None else None,
        "layer": event.layer,
        "param": event.param,
        "step_start": event.step_start,
        "step_end": event.step_end,
        "from_state": None if event.from_state is None else str(event.from_state),
        "to_state": str(event.to_state),
        "metrics": {k: json_number(v) for k, v in event.metrics.items()},
        "text": str(event),
        "where": where(event),
        "cause": where(coupling.cause) if coupling is not None else None,
        "relation": coupling.relation if coupling is not None else None,
    }


def hypothesis_dict(h: Any) -> HypothesisRecord:
    """A :class:`~neuraldbg.CausalHypothesis` as plain data (its chain in causal order, root first)."""
    cause_of = {id(c.effect): c for c in h.couplings}
    return {
        "kind": h.kind.value,
        "confidence": float(h.confidence),
        "summary": h.summary(),
        "explanation": h.explanation,
        "suggestion": h.suggestion,
        "layer": h.root.layer,
        "step": h.root.step_start,
        "chain": [event_dict(e, cause_of.get(id(e))) for e in h.chain],
    }


def key(hypothesis: HypothesisRecord) -> tuple[str, str, int]:
    """What identifies a hypothesis within its run: kind, root layer, onset step."""
    return (str(hypothesis["kind"]), str(hypothesis["layer"]), int(hypothesis["step"]))


def grad_chart_series(dbg: Any, hypotheses: list[Any]) -> list[ChartSeries]:
    """Gradient norm series of the first layer, the root's layer and the last layer (those with parameters).

    A root without parameters (a dead ReLU) is charted through the nearest parametric layer before it.
    """
    history = getattr(dbg, "history", None)
    if history is None:
        return []
    order = list(dbg.layers)
    parametric = [name for name in order if history.get("grad_norm", name) is not None]
    parametric += [name for name in history.layers("grad_norm") if name not in parametric]
    if not parametric:
        return []
    picks: list[tuple[str, str, str]] = [(parametric[0], f"first layer '{parametric[0]}'", "")]
    root = hypotheses[0].root.layer if hypotheses else ""
    charted = _nearest_parametric(root, order, parametric)
    if charted is not None:
        role = "the root" if charted == root else f"feeds root '{root}'"
        label = f"root '{root}'" if charted == root else f"'{charted}' (feeds root '{root}')"
        picks.append((charted, label, f" ({role})"))
    picks.append((parametric[-1], f"last layer '{parametric[-1]}'", " (also the last layer)"))
    out: list[ChartSeries] = []
    for layer, label, merged in picks:
        same = [s for s in out if s["layer"] == layer]
        if same:  # the root is the first or the last layer: one line, both roles in its label
            same[0]["label"] += merged
            continue
        points = history.get("grad_norm", layer).points()
        out.append({"layer": layer, "label": label, "points": [[int(s), json_number(v)] for s, v in points]})
    return out


def key_numbers(dbg: Any) -> KeyNumbers:
    """The run's final loss and, at the last step any layer recorded a gradient norm, the smallest and the largest
    norm among the layers (with their names); what it did not record is left out."""
    history = getattr(dbg, "history", None)
    out: KeyNumbers = {}
    if history is None:
        return out
    loss = history.get("loss", "")
    if loss is not None and len(loss):
        out["final_loss"] = json_number(loss.points()[-1][1])
    finals = {}
    for layer in history.layers("grad_norm"):
        points = history.get("grad_norm", layer).points()
        if points:
            finals[layer] = points[-1]
    if finals:
        step = max(int(s) for s, _ in finals.values())
        at_step = {layer: float(v) for layer, (s, v) in finals.items() if int(s) == step}
        low = min(at_step, key=lambda layer: at_step[layer])
        high = max(at_step, key=lambda layer: at_step[layer])
        out["grad_step"] = step
        out["grad_min"] = [low, json_number(at_step[low])]
        out["grad_max"] = [high, json_number(at_step[high])]
    return out


def _nearest_parametric(root: str, order: list[str], parametric: list[str]) -> str | None:
    if not root:
        return None
    if root in parametric:
        return root
    if root not in order:
        return None
    index = order.index(root)
    before = [name for name in order[:index] if name in parametric]
    after = [name for name in order[index + 1 :] if name in parametric]
    return before[-1] if before else (after[0] if after else None)


def summarise(dbg: Any, *, nodeid: str, run: str, include_trace: bool = False, gate: str = "") -> RunRecord:
    """The record of one watched run. Never raises: a failure of the engine becomes an ``error`` record.

    Each hypothesis says whether an assertion helper of the test failed on it (``asserted``): when the test
    passed anyway, it caught that failure on purpose (``pytest.raises``), so the gate does not fail it again.
    """
    record: RunRecord = {"nodeid": nodeid, "run": run, "steps": 0, "hypotheses": [], "mermaid": "", "kinds": []}
    try:
        hypotheses = list(dbg.hypotheses())
        asserted = set(getattr(dbg, "asserted", ()))  # failures an assertion helper raised on (see watched.py)
        ignored = set(getattr(dbg, "ignored", ()))  # kinds the test ignored (assert_healthy(ignore=...))
        found = [hypothesis_dict(h) for h in hypotheses]
        for h in found:
            h["asserted"] = key(h) in asserted
            if h["kind"] in ignored:
                h["ignored"] = True
        if gate:
            record["gate"] = gate
        record["verdict"] = UNHEALTHY if hypotheses else HEALTHY
        record["steps"] = int(dbg.steps)
        record["kinds"] = list(dbg.checked_kinds())
        record["hypotheses"] = found
        record["mermaid"] = dbg.export_mermaid_causal_graph()
        record["grad_chart"] = grad_chart_series(dbg, hypotheses) if hypotheses else []
        record["numbers"] = key_numbers(dbg)
        if include_trace:
            record["trace"] = dbg.to_dict()
        return _plain(record)
    except Exception as exc:  # reports must never break the test run they describe
        failed: RunRecord = {"nodeid": nodeid, "run": run, "steps": 0, "hypotheses": [], "mermaid": "", "kinds": []}
        failed["verdict"] = ERROR
        failed["error"] = f"NeuralDBG could not summarise this run: {exc!r}"
        return _plain(failed)


def _plain(record: RunRecord) -> RunRecord:
    """The record as plain builtins (xdist's serialiser refuses str subclasses such as torch's TorchVersion) whose
    text is inert (see :mod:`neuraldbg.export.inert`): names from the model, whatever they hold, reach every report
    as visible escapes, and no string holds a lone surrogate that an encoder (the report files, xdist's channel)
    would refuse. The node id stays as pytest gave it (reports match outcomes by it); the trace is data, kept as it
    is but for lone surrogates."""
    data = json.loads(json.dumps(record, allow_nan=False))
    keep = {key: data.pop(key) for key in ("nodeid", "mermaid", "trace") if key in data}
    out = inert_data(data)
    out["nodeid"] = encodable(keep["nodeid"])
    out["mermaid"] = inert(keep.get("mermaid", ""), lines=True)
    if "trace" in keep:
        out["trace"] = encodable_data(keep["trace"])
    return cast(RunRecord, out)


def run_label(record: RunRecord, runs_in_test: int = 1) -> str:
    """``tests/test_x.py::test_y`` or, for a test with several runs, ``tests/test_x.py::test_y [run 2]``."""
    nodeid = str(record["nodeid"])
    return nodeid if runs_in_test <= 1 else f"{nodeid} [run {record['run']}]"
