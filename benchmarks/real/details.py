"""The evidence behind every wrong answer of a run, as Markdown: ``python -m benchmarks.real --details RUN.json``.

For each false alarm, miss and wrong kind or root: what plain torch measured (the metric against the twin, the
loss at both ends, the gradient norms of the layers involved, dead units, frozen parameters) and everything
NeuralDBG said (each hypothesis' summary and the start of its explanation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import score


def _num(x: float) -> str:
    return f"{x:.4g}"


def _grads(ev: dict[str, Any], twin: dict[str, Any], layers: list[str]) -> str:
    grads, twin_grads = ev["probe"].get("grad_norms", {}), twin["probe"].get("grad_norms", {})
    parts = []
    for layer in layers:
        g, t = grads.get(layer), twin_grads.get(layer)
        if g is None:
            continue
        here = f"median {_num(g['median'])}, max {_num(g['max'])}, last quarter {_num(g.get('tail', g['last']))}"
        there = f" (twin: {_num(t['median'])}, {_num(t['max'])}, {_num(t.get('tail', t['last']))})" if t else ""
        parts.append(f"'{layer}' {here}{there}")
    return "; ".join(parts)


def case_block(entry: dict[str, Any], twin: dict[str, Any], result: dict[str, Any], verdict: str) -> list[str]:
    ev, tev = entry["evidence"], twin["evidence"]
    lines = [f"#### {entry['id']} ({verdict})", ""]
    lines.append(f"*{entry['description']}* (operator: {entry['operator']}).")
    lines.append("")
    metric = ", ".join(_num(m) for m in ev["metric"])
    twin_metric = ", ".join(_num(m) for m in tev["metric"])
    lines.append(
        f"- Plain torch: {ev['metric_name']} {metric} over seeds {ev['seeds']} against the twin's {twin_metric} "
        f"(margin {_num(ev['margin'])}); training loss {_num(ev['loss_first'])} -> {_num(ev['loss_final'])} "
        f"(twin -> {_num(ev['twin_loss_final'])}), {ev['steps']} steps."
    )
    if entry["reasons"]:
        lines.append(f"- Harmful because: {'; '.join(entry['reasons'])}.")
    if entry["harmful"]:
        lines.append(
            f"- Acceptable kinds: {', '.join(entry['kinds'])}" + (f"; root {entry['root']}" if entry["root"] else "")
        )
        if entry["measured_kinds"]:
            measured = ", ".join(f"{k} {v}" if v else k for k, v in entry["measured_kinds"].items())
            lines.append(f"- Symptoms measured by the probe: {measured}.")
    named = [h["layer"] for h in result["hypotheses"] if h["layer"]]
    layers = list(dict.fromkeys(named + [x for r in (entry["root"] or []) for x in [r]]))[:4]
    if not layers:
        layers = sorted(ev["probe"].get("grad_norms", {}), key=lambda k: -ev["probe"]["grad_norms"][k]["max"])[:2]
    text = _grads(ev, tev, layers)
    if text:
        lines.append(f"- Gradient norms: {text}.")
    dead = {**ev["probe"].get("never_positive", {}), **ev["probe"].get("dead_at_end", {})}
    if dead:
        lines.append(
            f"- Units never positive (run / last quarter): {ev['probe'].get('never_positive', {})} / "
            f"{ev['probe'].get('dead_at_end', {})}."
        )
    if result["hypotheses"]:
        lines.append("- NeuralDBG said:")
        for h in result["hypotheses"][:3]:
            lines.append(f"  - `{h['summary']}`: {h['explanation'][:400]}")
    else:
        lines.append("- NeuralDBG said: healthy.")
    lines.append("")
    return lines


def details(truth: dict[str, dict[str, Any]], run_path: str) -> str:
    run = json.loads(Path(run_path).read_text())
    results = run["results"]
    scored = score.score(truth, results)
    out = []
    for r in results:
        entry, v = truth[r["id"]], scored["verdicts"][r["id"]]
        if not entry["harmful"]:
            verdict = "false alarm" if v["false_alarm"] else ""
        elif not v["detected"]:
            verdict = "miss"
        elif not v["right_kind"]:
            verdict = "wrong kind"
        elif v.get("right_root") is False:
            verdict = "wrong root"
        else:
            verdict = ""
        if verdict:
            out += case_block(entry, truth[f"{entry['program']}.healthy"], r, verdict)
    return "\n".join(out)
