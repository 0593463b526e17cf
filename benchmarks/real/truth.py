"""The ground truth, decided by plain torch: each variant trained without NeuralDBG beside its healthy twin.

For every case the program is trained once per seed of :data:`SEEDS` (same data, same seeds as the twin), with
the evidence probe (:mod:`benchmarks.real.probe`) on the first seed. A mutant is **harmful** when any of these
holds, else **harmless** (it trains as well as its twin, so silence is the right answer):

* its held-out task metric, averaged over the seeds, is worse than the twin's by more than the *margin*:
  ``max(3 x the twin's standard deviation over seeds, the program's floor)`` (the floor is the smallest deficit
  that matters for the metric: 3 accuracy points, or a fraction of the twin's loss);
* a loss, gradient or parameter became NaN or infinite on some seed;
* parameters that train in the twin never changed at all;
* its operator is a defect by definition (:data:`DEFECTS`), whatever the metric shows.

The training loss is recorded (first and final window medians) but does not decide: a mutant may change the
loss itself (a wrong loss, wrong labels, weight decay), so the held-out metric, computed by the program's own
correct evaluation, is what is compared.

The acceptable failure kinds of a harmful case are the variant's hand-assigned kinds (the names of its fault,
:mod:`benchmarks.real.kinds`) plus the kinds whose symptom the probe measured against the twin
(:func:`evidence_kinds`). The root layer is hand-assigned (the layer the fault lives in) or None.
"""

from __future__ import annotations

import math
import statistics
import time
import traceback
from typing import Any

from .core import HEALTHY, Case, Session

SEEDS = (0, 1, 2)
EXPLODING_NORM = 1e3  # a layer gradient norm this large, and EXPLODING_FACTOR x the twin's, is an explosion
EXPLODING_FACTOR = 10.0
VANISHING_FACTOR = 1e-3  # a layer's late gradient this far below the twin's has vanished
DEAD_FRACTION = 0.7  # units never positive: a dead layer (the twin's below 0.5)
SATURATED_FRACTION = 0.5  # outputs of a hidden bounded activation on its flat parts
#: Operators whose mutants are faults whatever the metric shows, each with the reason written into the truth.
#: A missing ``optimizer.zero_grad()`` is one (issue 17 asks it found "whatever the loss curve does"): every step
#: then applies the sum of all gradients so far, which happens to train as well only while the summed
#: direction stays a useful one (Adam's normalisation hides it on the tiny BERT; more steps or another
#: optimizer do not).
DEFECTS = {"zero_grad": "optimizer.zero_grad() missing: a defect by definition, whatever the metric shows"}


def _window(values: list[float]) -> int:
    return max(5, len(values) // 10)


def _median(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if len(finite) == len(values) and values else float("nan")


def train_plain(case: Case, seed: int, probe: bool) -> dict[str, Any]:
    """One plain-torch training run of a case: its metric, its loss curve's ends, and (probe) the evidence."""
    session = Session("probe" if probe else "plain")
    session.relu_inputs = case.program.functional_relu
    hp = case.program.settings(case.variant, seed)
    start = time.perf_counter()
    error = None
    try:
        out = case.program.train(hp, session)
        metric = float(out["metric"])
    except Exception:  # a crash is an outcome too (a NaN that makes a sampler raise)
        error = traceback.format_exc(limit=3).strip().splitlines()[-1]
        metric = float("nan")
    losses = session.losses
    w = _window(losses) if losses else 0
    result: dict[str, Any] = {
        "seed": seed,
        "metric": metric,
        "steps": len(losses),
        "loss_first": _median(losses[:w]),
        "loss_final": _median(losses[-w:]),
        "loss_nonfinite": any(not math.isfinite(v) for v in losses),
        "seconds": round(time.perf_counter() - start, 2),
        "error": error,
    }
    if probe and session.probe is not None:
        result["probe"] = session.probe.summary()
    return result


def runs_of(case: Case) -> list[tuple[Case, int, bool]]:
    """The training runs a case's ground truth needs: one per seed, the probe on the first."""
    return [(case, seed, seed == SEEDS[0]) for seed in SEEDS]


def _nonfinite(run: dict[str, Any]) -> bool:
    probe = run.get("probe", {})
    return bool(run["loss_nonfinite"] or probe.get("nonfinite_grad") or probe.get("nonfinite_param"))


def _frozen_layers(names: list[str]) -> list[str]:
    return sorted({name.split(":")[-1].rpartition(".")[0] for name in names})


def newly_frozen(run: dict[str, Any], twin: dict[str, Any]) -> list[str]:
    """Parameters that never changed in this run although they train in the twin (they change there and get a
    gradient that is not negligible: a conv bias right before a BatchNorm gets ~0 by construction)."""
    probe, twin_probe = run.get("probe", {}), twin.get("probe", {})
    twin_grads = twin_probe.get("param_grad_max", {})
    largest = max(twin_grads.values(), default=0.0)
    trains = {name for name, g in twin_grads.items() if g > 1e-6 * largest}
    return sorted(set(probe.get("frozen", [])) - set(twin_probe.get("frozen", [])) & trains)


def evidence_kinds(run: dict[str, Any], twin: dict[str, Any]) -> dict[str, list[str]]:
    """The kinds whose symptom plain torch measured in this run and not in its twin, with the layers showing it.

    * non_finite: a NaN or infinity in the loss, a gradient or a parameter;
    * exploding_gradients: a layer's largest gradient norm above 1e3 and ten times the twin's largest;
    * vanishing_gradients: a layer's gradient over the last quarter of the run exactly zero, or below 1e-3 of the
      twin's there (all layers exactly zero: also degenerate_loss and no_gradient);
    * dead_neurons: a ReLU layer with at least 70 % of its units never positive, over the run or over its last
      quarter (the twin's below 50 %);
    * saturated_activations: a hidden tanh/sigmoid with more than half its outputs where its derivative is below
      1 % of its maximum over the last quarter (the twin's at most a quarter);
    * frozen_parameters: parameters that got a gradient yet never changed, while they train in the twin.
    """
    found: dict[str, list[str]] = {}
    probe, twin_probe = run.get("probe", {}), twin.get("probe", {})
    if _nonfinite(run):
        found["non_finite"] = []
    grads, twin_grads = probe.get("grad_norms", {}), twin_probe.get("grad_norms", {})
    exploding = [
        layer
        for layer, g in grads.items()
        if math.isfinite(g["max"])
        and g["max"] > EXPLODING_NORM
        and g["max"] > EXPLODING_FACTOR * twin_grads.get(layer, {}).get("max", 0.0)
    ]
    if exploding:
        found["exploding_gradients"] = exploding
    zero, small = [], []
    for layer, g in grads.items():
        twin_tail = twin_grads.get(layer, {}).get("tail", 0.0)
        if twin_tail > 0 and g["tail"] == 0.0:
            zero.append(layer)
        elif twin_tail > 0 and g["tail"] < VANISHING_FACTOR * twin_tail:
            small.append(layer)
    if zero and len(zero) == len(grads):
        found["degenerate_loss"] = []
        found["no_gradient"] = []
    if zero or small:
        found["vanishing_gradients"] = zero + small
    dead = []
    for layer in probe.get("never_positive", {}):
        worst = max(probe["never_positive"][layer], probe.get("dead_at_end", {}).get(layer, 0.0))
        twin_worst = max(
            twin_probe.get("never_positive", {}).get(layer, 0.0), twin_probe.get("dead_at_end", {}).get(layer, 0.0)
        )
        if worst >= DEAD_FRACTION and twin_worst < 0.5:
            dead.append(layer)
    if dead:
        found["dead_neurons"] = dead
    twin_saturated = twin_probe.get("saturated", {})
    saturated = [
        layer
        for layer, fraction in probe.get("saturated", {}).items()
        if fraction > SATURATED_FRACTION and twin_saturated.get(layer, 0.0) <= SATURATED_FRACTION / 2
    ]
    if saturated:
        found["saturated_activations"] = saturated
    # frozen as NeuralDBG means it: a gradient arrived and the parameter did not move (else it is a zero gradient)
    grads_of = probe.get("param_grad_max", {})
    frozen = [name for name in newly_frozen(run, twin) if grads_of.get(name, 0.0) > 0]
    if frozen:
        found["frozen_parameters"] = _frozen_layers(frozen)
    return found


def decide(case: Case, runs: list[dict[str, Any]], twin_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ground-truth entry of a case, from its runs and its healthy twin's (the same seeds)."""
    program, variant = case.program, case.variant
    twin_metrics = [r["metric"] for r in twin_runs]
    metrics = [r["metric"] for r in runs]
    twin_mean = statistics.fmean(twin_metrics)
    twin_sd = statistics.stdev(twin_metrics) if len(twin_metrics) > 1 else 0.0
    floor = program.floor * abs(twin_mean) if program.relative_floor else program.floor
    margin = max(3 * twin_sd, floor)
    if all(math.isfinite(m) for m in metrics):
        mean = statistics.fmean(metrics)
        deficit = (twin_mean - mean) if program.higher_is_better else (mean - twin_mean)
    else:
        mean, deficit = float("nan"), float("inf")
    first, twin_first = runs[0], twin_runs[0]
    reasons = []
    if variant.name != HEALTHY:
        if deficit > margin:
            reasons.append(
                f"{program.metric} {mean:.4g} vs the twin's {twin_mean:.4g}: "
                f"worse by {deficit:.3g} > margin {margin:.3g}"
            )
        if any(_nonfinite(r) for r in runs):
            reasons.append("non-finite loss, gradient or parameter")
        frozen = newly_frozen(first, twin_first)
        if frozen:
            reasons.append(f"{len(frozen)} parameters never changed ({', '.join(_frozen_layers(frozen)[:4])})")
        errors = [r["error"] for r in runs if r["error"]]
        if errors:
            reasons.append(f"training raised: {errors[0]}")
        if not reasons and variant.operator in DEFECTS:
            reasons.append(DEFECTS[variant.operator])
    harmful = bool(reasons)
    measured = evidence_kinds(first, twin_first) if harmful else {}
    kinds = sorted(variant.kinds | set(measured)) if harmful else []
    return {
        "id": case.id,
        "family": program.family,
        "program": program.name,
        "variant": variant.name,
        "operator": variant.operator,
        "description": variant.description,
        "change": {k: v for k, v in variant.change.items()},
        "harmful": harmful,
        "reasons": reasons,
        "kinds": kinds,
        "hand_kinds": sorted(variant.kinds),
        "measured_kinds": measured,
        "root": list(variant.root) if harmful and variant.root else None,
        "evidence": {
            "metric_name": program.metric,
            "higher_is_better": program.higher_is_better,
            "seeds": list(SEEDS),
            "metric": metrics,
            "metric_mean": mean,
            "twin_metric": twin_metrics,
            "twin_mean": twin_mean,
            "twin_sd": twin_sd,
            "margin": margin,
            "deficit": deficit,
            "chance": program.chance,
            "loss_first": first["loss_first"],
            "loss_final": first["loss_final"],
            "twin_loss_final": twin_first["loss_final"],
            "steps": first["steps"],
            "seconds": first["seconds"],
            "probe": _compact(first.get("probe", {})),
        },
    }


def _compact(probe: dict[str, Any]) -> dict[str, Any]:
    """The probe's summary as stored: gradient norms rounded, dead fractions above 1%, frozen names."""
    if not probe:
        return {}
    return {
        "grad_norms": {layer: {k: float(f"{v:.4g}") for k, v in g.items()} for layer, g in probe["grad_norms"].items()},
        "nonfinite_grad": probe["nonfinite_grad"],
        "nonfinite_param": probe["nonfinite_param"],
        "frozen": probe["frozen"],
        "frozen_grad_max": {name: float(f"{probe['param_grad_max'].get(name, 0.0):.4g}") for name in probe["frozen"]},
        "never_positive": {k: round(v, 4) for k, v in probe["never_positive"].items() if v > 0.01},
        "dead_at_end": {k: round(v, 4) for k, v in probe["dead_at_end"].items() if v > 0.01},
        "saturated": {k: round(v, 4) for k, v in probe["saturated"].items() if v > 0.01},
    }


def learns(entry: dict[str, Any]) -> bool:
    """Whether a healthy program's metric clearly beats chance (a benchmark of programs that learn nothing
    would measure nothing)."""
    ev = entry["evidence"]
    if ev["chance"] is None:
        return ev["loss_final"] < 0.8 * ev["loss_first"]
    gap = (ev["twin_mean"] - ev["chance"]) if ev["higher_is_better"] else (ev["chance"] - ev["twin_mean"])
    return gap > ev["margin"]
