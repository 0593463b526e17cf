"""The public diagnosis benchmark: how often NeuralDBG is right, and how often it cries wolf.

    python -m benchmarks.diagnosis              # every scenario, the tables of docs/benchmark.md
    python -m benchmarks.diagnosis --fast       # the subset the test suite runs
    python -m benchmarks.diagnosis NAME ...     # chosen scenarios, with their full explanations

Two sets are scored apart: the calibration set (``benchmarks/scenarios/*``), on which the thresholds were
tuned, and a held-out set (``benchmarks/scenarios/holdout.py``), written afterwards by someone who did not read
the engine, with other architectures, optimizers and loops: it measures how the defaults generalise.

Each scenario (``benchmarks/scenarios``) is trained exactly as a user would, wrapped in ``NeuralDbg`` with the
default configuration, and the hypotheses are compared with its ground truth (checked with plain torch by
``python -m benchmarks.evidence``):

* detected: every failure kind the truth requires is named;
* false alarm: a healthy scenario gets any hypothesis;
* spurious: a named kind that is neither required nor an accepted side effect;
* root / onset: the first hypothesis of a required kind has an accepted root layer / onset step (scored only
  where the truth defines them).

Exits 1 when a target is missed: recall >= 0.95, no false alarm, root layer >= 0.9, onset step >= 0.9.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
import warnings
from dataclasses import dataclass, field

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402

from neuraldbg import CausalHypothesis, NeuralDbg  # noqa: E402

from .scenarios import SCENARIOS, Scenario, get  # noqa: E402
from .scenarios.holdout import SCENARIOS as HOLDOUT  # noqa: E402

TARGETS = {"recall": 0.95, "false_alarms": 0.0, "root": 0.9, "onset": 0.9}

#: One or two scenarios per failure kind and architecture family, plus hard healthy ones: what CI runs.
FAST = (
    "healthy_tiny_readme",
    "healthy_deep_residual_layernorm",
    "healthy_cnn_conv_bias_before_bn",
    "healthy_sparse_relu",
    "healthy_sigmoid_bce_confident",
    "healthy_finetune_frozen_backbone",
    "dead_bias_tiny",
    "dead_after_lr_jump_cnn",
    "saturated_tanh_normal_init",
    "vanishing_deep_sigmoid_mlp",
    "exploding_lr_too_high_mlp",
    "nonfinite_nan_batch_mlp",
    "nonfinite_loss_log_zero",
    "frozen_layer_left_out_of_optimizer",
    "stalled_sgd_lr_1e-7",
    "zerograd_missing_mlp_sgd",
    "zerograd_missing_cnn_sgd_momentum",
    "healthy_accumulate_then_grad_none_mlp",
)


@dataclass
class Result:
    scenario: Scenario
    hypotheses: list[CausalHypothesis]
    seconds: float
    named: set[str] = field(init=False)

    def __post_init__(self) -> None:
        self.named = {h.kind.value for h in self.hypotheses}

    @property
    def truth(self):  # type: ignore[no-untyped-def]
        return self.scenario.truth

    @property
    def detected(self) -> bool:
        return self.truth.kinds <= self.named

    @property
    def false_alarm(self) -> bool:
        return self.truth.healthy and bool(self.named)

    @property
    def spurious(self) -> set[str]:
        return self.named - self.truth.kinds - self.truth.may_also

    @property
    def primary(self) -> CausalHypothesis | None:
        """The first (most likely) hypothesis of a required kind."""
        return next((h for h in self.hypotheses if h.kind.value in self.truth.kinds), None)

    @property
    def root_ok(self) -> bool | None:
        if self.truth.root_layers is None or self.truth.healthy:
            return None
        return self.primary is not None and self.primary.root.layer in self.truth.root_layers

    @property
    def onset_ok(self) -> bool | None:
        if self.truth.onset is None or self.truth.healthy:
            return None
        low, high = self.truth.onset
        return self.primary is not None and low <= self.primary.root.step_start <= high

    @property
    def correct(self) -> bool:
        if self.truth.healthy:
            return not self.false_alarm
        return self.detected and not self.spurious and self.root_ok is not False and self.onset_ok is not False


def run(scenario: Scenario) -> Result:
    built = scenario.build()
    start = time.perf_counter()
    with NeuralDbg(built.model) as dbg:
        built.train()
    hypotheses = dbg.hypotheses()
    return Result(scenario, hypotheses, time.perf_counter() - start)


def _mark(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "**no**")


def table(results: list[Result]) -> str:
    rows = [
        "| scenario | arch | truth | diagnosis (root @ onset) | root | onset | verdict | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        truth = ", ".join(sorted(r.truth.kinds)) or "healthy"
        said = (
            "; ".join(
                f"{h.kind.value} ('{h.root.layer}' @ {h.root.step_start})"
                if h.root.layer
                else f"{h.kind.value} (model @ {h.root.step_start})"
                for h in r.hypotheses[:3]
            )
            or "healthy"
        )
        if len(r.hypotheses) > 3:
            said += f"; +{len(r.hypotheses) - 3}"
        verdict = "ok" if r.correct else ("**false alarm**" if r.false_alarm else "**wrong**")
        if r.spurious and not r.truth.healthy:
            verdict += f" (spurious: {', '.join(sorted(r.spurious))})"
        rows.append(
            f"| {r.scenario.name} | {r.scenario.arch} | {truth} | {said} | {_mark(r.root_ok)} | {_mark(r.onset_ok)} "
            f"| {verdict} | {r.seconds:.2f} |"
        )
    return "\n".join(rows)


def summary(results: list[Result]) -> dict[str, float]:
    faults = [r for r in results if not r.truth.healthy]
    healthy = [r for r in results if r.truth.healthy]
    roots = [r.root_ok for r in faults if r.root_ok is not None]
    onsets = [r.onset_ok for r in faults if r.onset_ok is not None]

    def rate(values: list[bool]) -> float:
        return sum(values) / len(values) if values else 1.0

    return {
        "scenarios": len(results),
        "faulty": len(faults),
        "healthy": len(healthy),
        "recall": rate([r.detected for r in faults]),
        "false_alarms": rate([r.false_alarm for r in healthy]) if healthy else 0.0,
        "root": rate(roots),
        "root_n": len(roots),
        "onset": rate(onsets),
        "onset_n": len(onsets),
        "spurious": sum(len(r.spurious) for r in faults),
        "seconds": sum(r.seconds for r in results),
    }


def report(results: list[Result], title: str = "") -> tuple[str, bool]:
    s = summary(results)
    ok = (
        s["recall"] >= TARGETS["recall"]
        and s["false_alarms"] <= TARGETS["false_alarms"]
        and s["root"] >= TARGETS["root"]
        and s["onset"] >= TARGETS["onset"]
    )
    detected = round(s["recall"] * s["faulty"])
    alarms = round(s["false_alarms"] * s["healthy"])
    lines = [
        f"NeuralDBG diagnosis benchmark{', ' + title if title else ''}, {datetime.date.today().isoformat()}, "
        f"torch {torch.__version__}",
        "",
        table(results),
        "",
        "| metric | value | target |",
        "|---|---|---|",
        f"| detection recall | {s['recall']:.2f} ({detected}/{s['faulty']} faulty scenarios) | >= 0.95 |",
        f"| false-alarm rate | {s['false_alarms']:.2f} ({alarms}/{s['healthy']} healthy scenarios) | 0 |",
        f"| root-layer accuracy | {s['root']:.2f} ({round(s['root'] * s['root_n'])}/{s['root_n']}) | >= 0.9 |",
        f"| onset-step accuracy | {s['onset']:.2f} ({round(s['onset'] * s['onset_n'])}/{s['onset_n']}) | >= 0.9 |",
        f"| spurious kinds named | {s['spurious']} | - |",
        f"| seconds (training under the debugger) | {s['seconds']:.1f} | - |",
        "",
        "all targets met" if ok else "TARGETS MISSED",
    ]
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the NeuralDBG diagnosis benchmark.")
    parser.add_argument("names", nargs="*", help="scenario names (default: all)")
    parser.add_argument("--fast", action="store_true", help="only the subset the test suite runs")
    parser.add_argument("--explain", action="store_true", help="print every hypothesis' explanation")
    args = parser.parse_args(argv)
    holdout = {s.name: s for s in HOLDOUT}
    try:
        if args.names:
            sets = [("chosen", [holdout[n] if n in holdout else get(n) for n in args.names])]
        elif args.fast:
            sets = [("fast subset", [get(n) for n in FAST])]
        else:
            sets = [("calibration set", SCENARIOS), ("held-out set", HOLDOUT)]
    except KeyError as exc:
        print(f"benchmarks.diagnosis: {exc.args[0]}", file=sys.stderr)
        return 2
    ok = True
    for title, chosen in sets:
        results = []
        for scenario in chosen:
            result = run(scenario)
            results.append(result)
            if args.explain or args.names:
                print(f"--- {scenario.name}: {scenario.description}")
                for h in result.hypotheses:
                    print(f"  * {h.summary()}\n    {h.explanation}")
        text, met = report(results, title)
        print(text, end="\n\n")
        ok &= met
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
