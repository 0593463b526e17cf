"""Scoring NeuralDBG's answers against the stored plain-torch ground truth, and the printed table."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any


def _pct(part: int, total: int) -> str:
    return f"{part}/{total} ({100 * part / total:.0f}%)" if total else "0/0 (-)"


def harmful_on_first_seed(entry: dict[str, Any]) -> bool:
    """Whether the run NeuralDBG watches (the first seed) is harmed on its own, not only the average over seeds:
    its own metric is past the margin, or a reason other than the metric holds (NaN, frozen parameters)."""
    ev = entry["evidence"]
    first = ev["metric"][0]
    deficit = (ev["twin_mean"] - first) if ev["higher_is_better"] else (first - ev["twin_mean"])
    other = [r for r in entry["reasons"] if "worse by" not in r]
    return bool(other) or not math.isfinite(first) or deficit > ev["margin"]


def judge(entry: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """What one case's answer was worth: a false alarm, a detection, the right kind, the right root."""
    hyps = result["hypotheses"]
    top = hyps[0] if hyps else None
    verdict: dict[str, Any] = {"id": entry["id"], "harmful": entry["harmful"], "top": top}
    if not entry["harmful"]:
        verdict["false_alarm"] = bool(hyps)
        verdict["run_level"] = bool(hyps) and all(h["layer"] == "" for h in hyps)
        # the alarm names the mutation itself (a defect the program truly has, which did not harm its metric):
        # told apart, not excused
        verdict["names_mutation"] = top is not None and top["kind"] in entry["hand_kinds"]
        return verdict
    verdict["detected"] = bool(hyps)
    verdict["first_seed"] = harmful_on_first_seed(entry)
    verdict["right_kind"] = top is not None and top["kind"] in entry["kinds"]
    verdict["names_fault"] = top is not None and top["kind"] in entry["hand_kinds"]
    verdict["any_kind"] = any(h["kind"] in entry["kinds"] for h in hyps)
    if entry["root"] is not None:
        verdict["right_root"] = top is not None and top["layer"] in entry["root"]
    return verdict


def score(truth: dict[str, dict[str, Any]], results: list[dict[str, Any]]) -> dict[str, Any]:
    verdicts = [judge(truth[r["id"]], r) for r in results]
    by_id = {v["id"]: v for v in verdicts}
    quiet = [v for v in verdicts if not v["harmful"]]
    healthy = [v for v in quiet if truth[v["id"]]["variant"] == "healthy"]
    harmless = [v for v in quiet if truth[v["id"]]["variant"] != "healthy"]
    harmful = [v for v in verdicts if v["harmful"]]
    rooted = [v for v in harmful if "right_root" in v]
    operators: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for v in harmful:
        operators[truth[v["id"]]["operator"]].append(v)
    return {
        "cases": len(verdicts),
        "healthy": _count(healthy, "false_alarm"),
        "harmless": _count(harmless, "false_alarm"),
        "false_alarms": _count(quiet, "false_alarm"),
        "false_alarm_ids": [v["id"] for v in quiet if v["false_alarm"]],
        "harmless_named": _count([v for v in harmless if v["false_alarm"]], "names_mutation"),
        "recall": _count(harmful, "detected"),
        "recall_first_seed": _count([v for v in harmful if v["first_seed"]], "detected"),
        "right_kind": _count(harmful, "right_kind"),
        "names_fault": _count(harmful, "names_fault"),
        "any_kind": _count(harmful, "any_kind"),
        "right_root": _count(rooted, "right_root"),
        "operators": {
            op: {"detected": _count(vs, "detected"), "right_kind": _count(vs, "right_kind")}
            for op, vs in sorted(operators.items())
        },
        "verdicts": by_id,
    }


def _count(verdicts: list[dict[str, Any]], key: str) -> list[int]:
    return [sum(1 for v in verdicts if v[key]), len(verdicts)]


def _got(top: dict[str, Any] | None) -> str:
    return "healthy (no hypothesis)" if top is None else top["summary"]


def wrong_lines(truth: dict[str, dict[str, Any]], results: list[dict[str, Any]], scored: dict[str, Any]) -> list[str]:
    lines = []
    for r in results:
        entry, v = truth[r["id"]], scored["verdicts"][r["id"]]
        if not entry["harmful"]:
            if v["false_alarm"]:
                label = "healthy program" if entry["variant"] == "healthy" else "harmless mutant"
                named = " (names the mutation made)" if v["names_mutation"] else ""
                lines.append(f"FALSE ALARM  {r['id']}: expected silence ({label}), got {_got(v['top'])}{named}")
            continue
        expected = "{" + ", ".join(entry["kinds"]) + "}"
        if entry["root"]:
            expected += f" at {' or '.join(repr(x) for x in entry['root'])}"
        if not v["detected"]:
            note = "" if v["first_seed"] else " (harmful over seeds; the watched seed-0 run is within the twin's noise)"
            lines.append(f"MISS         {r['id']}: expected {expected}, got {_got(None)}{note}")
        elif not v["right_kind"]:
            lines.append(f"WRONG KIND   {r['id']}: expected {expected}, got {_got(v['top'])}")
        elif v.get("right_root") is False:
            lines.append(f"WRONG ROOT   {r['id']}: expected {expected}, got {_got(v['top'])}")
    return lines


def differs(truth: dict[str, dict[str, Any]], result: dict[str, Any]) -> bool:
    """Whether a run under NeuralDBG ended with another metric than the stored plain run of the same seed."""
    return not same_metric(truth[result["id"]]["evidence"]["metric"][0], result["metric"])


def same_metric(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)


def same_run_lines(
    truth: dict[str, dict[str, Any]], results: list[dict[str, Any]], local: dict[str, float] | None = None
) -> list[str]:
    """Cases whose run under NeuralDBG did not reproduce the plain run of the same seed (the metric differs).

    The stored plain metric was computed on the machine that made the ground truth; another CPU rounds floats
    otherwise and a run drifts from it. ``local``: the plain metric of seed 0 trained on this machine, for the
    cases that differ from the stored one; a case the run under NeuralDBG reproduces here is no difference of
    NeuralDBG's (one line counts them)."""
    lines = []
    machine = []
    for r in results:
        plain = truth[r["id"]]["evidence"]["metric"][0]
        got = r["metric"]
        here = (local or {}).get(r["id"])
        if r["error"]:
            lines.append(f"ERROR        {r['id']}: {r['error']}")
        elif not differs(truth, r):
            continue
        elif here is not None and same_metric(here, got):
            machine.append(r["id"])
        else:
            also = f", {here:.6g} plain on this machine" if here is not None else ""
            lines.append(f"NOT THE SAME RUN {r['id']}: metric {got:.6g} under NeuralDBG, {plain:.6g} plain{also}")
    if machine:
        lines.append(
            f"{len(machine)} case(s) ended with another metric than the stored plain run (the ground truth's machine)"
            " and with the very metric of a plain run of the same seed on this machine: this CPU's rounding, not"
            " NeuralDBG"
        )
    return lines


def table(scored: dict[str, Any], wall: float, cpu: float, jobs: int) -> str:
    s = scored
    rows = [
        ("cases", str(s["cases"])),
        ("false alarms, healthy programs", _pct(*s["healthy"])),
        ("false alarms, harmless mutants", _pct(*s["harmless"])),
        ("... of which name the mutation made (a true defect, harmless here)", _pct(*s["harmless_named"])),
        ("false alarms, all quiet cases", _pct(*s["false_alarms"])),
        ("recall on harmful faults (any hypothesis)", _pct(*s["recall"])),
        ("recall where the watched run (seed 0) is itself harmed", _pct(*s["recall_first_seed"])),
        ("right kind (top hypothesis in the acceptable set)", _pct(*s["right_kind"])),
        ("top kind names the fault itself (not a measured symptom)", _pct(*s["names_fault"])),
        ("an acceptable kind anywhere in the hypotheses", _pct(*s["any_kind"])),
        ("right root layer (where the fault has one)", _pct(*s["right_root"])),
    ]
    out = ["| measure | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in rows]
    out.append(f"| wall time | {wall:.0f} s with --jobs {jobs} ({cpu:.0f} s of case time) |")
    out.append("")
    out.append("| operator family | harmful | detected | right kind |")
    out.append("|---|---|---|---|")
    for op, o in s["operators"].items():
        out.append(f"| {op} | {o['detected'][1]} | {_pct(*o['detected'])} | {_pct(*o['right_kind'])} |")
    return "\n".join(out)
