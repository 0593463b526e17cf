"""Plain-torch evidence that each held-out scenario's ground truth is right.

``python -m benchmarks.holdout_evidence [NAME ...]`` re-runs the scenarios of
``benchmarks/scenarios/holdout.py`` (no ``neuraldbg`` import) and prints, per scenario, what was measured and
"OK" or the contradictions with its ground truth.

It reuses ``benchmarks.evidence`` (``measure``, ``check``, ``report``: the definitions and thresholds the
calibration truths are written against) and adds what those do not cover here:

* initial gains (weight std x sqrt(fan_in)) of recurrent and Conv1d weights, not only Linear/Conv2d, so that
  an exploding root can be a GRU;
* saturation of functional ``torch.sigmoid`` / ``torch.tanh`` calls, measured on the producing layer's output
  (the calibration evidence sees only ``nn.Sigmoid`` / ``nn.Tanh`` modules);
* per-scenario checks of the claims a truth rests on: the fault is where the description says (parameters
  missing from the optimizer, a silent clip or NaN labels in one batch, clipping hiding the raw gradient
  norm), control runs without the fault do not show the symptom, and healthy runs really learn (validation
  loss, GAN sample statistics, reconstruction) besides the calibration's healthy checks.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.evidence import Evidence, check, measure, report, symptoms
from benchmarks.scenarios import holdout as h
from benchmarks.scenarios.base import Run, Scenario

SCENARIOS = h.SCENARIOS
_BY_NAME = {s.name: s for s in SCENARIOS}

SATURATED_FRACTION = 0.5
TANH_LIMIT = 0.995
SIGMOID_LOW, SIGMOID_HIGH = 0.0025, 0.9975

#: Layers whose output feeds a functional sigmoid or tanh in the model's forward.
FUNCTIONAL: dict[str, dict[str, str]] = {
    "holdout_vanishing_deep_sigmoid_nesterov": {f"hidden.{i}": "sigmoid" for i in range(8)},
    "holdout_frozen_lazy_param_created_in_forward": {"layers.proj": "tanh"},
    "holdout_healthy_small_lr_accumulation": {"layers.proj": "tanh"},
}


@dataclasses.dataclass
class Measured:
    """The calibration evidence of one run, the run itself (trained), and the extras measured alongside."""

    ev: Evidence
    run: Run
    functional: dict[str, list[float]]  # layer -> saturated fraction of its functional activation, per forward


# ------------------------------------------------------------------------------------------------ measuring


def gains(model: nn.Module) -> dict[str, float]:
    """Weight std x sqrt(fan_in) of every Linear, Conv1d/2d and recurrent module (its largest weight matrix)."""
    out: dict[str, float] = {}
    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            w = m.weight.detach()
            out[name] = float(w.std().item() * math.sqrt(w[0].numel()))
        elif isinstance(m, nn.RNNBase):
            values = [
                float(p.detach().std().item() * math.sqrt(p.shape[1]))
                for n, p in m.named_parameters()
                if n.startswith("weight_")
            ]
            out[name] = max(values)
    return out


def _saturation(kind: str, t: torch.Tensor) -> float:
    t = t.detach().float()
    if kind == "tanh":
        return (torch.tanh(t).abs() > TANH_LIMIT).float().mean().item()
    y = torch.sigmoid(t)
    return ((y < SIGMOID_LOW) | (y > SIGMOID_HIGH)).float().mean().item()


def measure_holdout(scenario: Scenario) -> Measured:
    """``benchmarks.evidence.measure`` plus the extras; the trained run is kept for the scenario checks."""
    runs: list[Run] = []
    functional: dict[str, list[float]] = {}
    layers = FUNCTIONAL.get(scenario.name, {})

    def build() -> Run:
        run = scenario.build()
        modules = dict(run.model.named_modules())
        for layer, kind in layers.items():
            series = functional.setdefault(layer, [])

            def hook(_m: nn.Module, _a: Any, out: torch.Tensor, kind: str = kind, series: list = series) -> None:
                series.append(_saturation(kind, out))

            modules[layer].register_forward_hook(hook)
        runs.append(run)
        return run

    ev = measure(dataclasses.replace(scenario, build=build))
    ev.init_gain.update(gains(scenario.build().model))
    return Measured(ev, runs[0], functional)


def control(scenario: Scenario, change: Callable[[Run], None]) -> Evidence:
    """The calibration evidence of the scenario's run with ``change`` applied to it first (the fault removed)."""

    def build() -> Run:
        run = scenario.build()
        change(run)
        return run

    return measure(dataclasses.replace(scenario, build=build))


def _loss_drop(losses: list[float]) -> float:
    head, tail = losses[:5], losses[-5:]
    return (sum(tail) / len(tail)) / (sum(head) / len(head))


def _params_of(opts: list[torch.optim.Optimizer]) -> set[int]:
    return {id(p) for opt in opts for group in opt.param_groups for p in group["params"]}


# ---------------------------------------------------------------------------------------- scenario checks

Lines = list[str]
Problems = list[str]
Extra = Callable[[Scenario, Measured], tuple[Lines, Problems]]
EXTRAS: dict[str, Extra] = {}


def extra(name: str) -> Callable[[Extra], Extra]:
    def register(fn: Extra) -> Extra:
        if name not in _BY_NAME:
            raise KeyError(f"no holdout scenario {name!r}")
        EXTRAS[name] = fn
        return fn

    return register


@extra("holdout_dead_vgg_negative_bias_block")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    ev = m.ev
    upstream = [n for n in ("features.0", "features.2", "features.5") if max(ev.grad_norm[n]) != 0.0]
    ctl = control(s, lambda run: nn.init.zeros_(run.model.features[5].bias))
    dead = {k: max(v) for k, v in ctl.dead.items() if ctl.kinds_of[k] == "ReLU"}
    lines = [
        f"   control with the bias at 0: symptoms {symptoms(ctl)}, loss drop {_loss_drop(ctl.losses):.2f}, "
        f"max dead fraction per ReLU {dead}"
    ]
    problems = [f"{n} gets a non-zero gradient" for n in upstream]
    if "dead_neurons" in symptoms(ctl):
        problems.append("the control run without the bias has dead ReLUs too")
    return lines, problems


@extra("holdout_dead_siamese_lr_jump")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    ctl = control(s, lambda run: setattr(run, "loop", h.siamese_loop(2.0)))
    before = max(m.ev.dead["act2"][:30])
    lines = [
        f"   act2 dead fraction before step 30 at most {before:.0%}; control without the phase-2 lr: "
        f"symptoms {symptoms(ctl)}, loss drop {_loss_drop(ctl.losses):.2f}"
    ]
    problems = []
    if before >= 0.2:
        problems.append(f"act2 is already {before:.0%} dead before the lr jump")
    if symptoms(ctl):
        problems.append(f"the control run without the lr jump shows {symptoms(ctl)}")
    return lines, problems


@extra("holdout_dead_multitask_trunk_rmsprop")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    def adam(run: Run) -> None:
        run.optimizers[0] = torch.optim.Adam(run.model.parameters(), lr=1e-3)

    ctl = control(s, adam)
    lines = [f"   control with Adam(lr=1e-3) instead of RMSprop: symptoms {symptoms(ctl)}"]
    return lines, ([f"the Adam control shows {symptoms(ctl)}"] if symptoms(ctl) else [])


@extra("holdout_exploding_gru_lm_clipped")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    ev = m.ev
    raw = [g for g in ev.total_grad_norm if math.isfinite(g)]
    above = sum(g > 1e3 for g in raw) / len(raw)
    largest_update = max(r for r in ev.total_update_ratio if math.isfinite(r))

    def orthogonal(run: Run) -> None:
        torch.manual_seed(0)
        for name, p in run.model.rnn.named_parameters():
            if name.startswith("weight_hh"):
                nn.init.orthogonal_(p)

    ctl = control(s, orthogonal)
    healthy = max(ctl.total_grad_norm)
    lowest = min(raw[1:])  # from step 1, where the truth's onset range ends at the latest
    lines = [
        f"   initial gains {{name: std*sqrt(fan_in)}}: { {k: round(v, 2) for k, v in ev.init_gain.items()} }",
        f"   raw (pre-clip) total grad norm {lowest:.2g}..{max(raw):.2g} from step 1 (> 1e3 at {above:.0%} of the "
        f"steps); largest update/weight ratio {largest_update:.2g} (clipping bounds the steps); loss drop "
        f"{_loss_drop(ev.losses):.2f}",
        f"   control with orthogonal recurrent weights: max raw grad norm {healthy:.2g}, "
        f"symptoms {symptoms(ctl)}, loss drop {_loss_drop(ctl.losses):.2f}",
    ]
    problems = []
    # exploding, not a spike: over 1e3 at a good part of the steps, and never back near the healthy scale between
    # (the flapping the engine's hysteresis spans reads at least a tenth of the threshold, 1e2)
    if above < 0.3:
        problems.append(f"the raw gradient norm exceeds 1e3 at only {above:.0%} of the steps")
    if lowest < 1e2 or lowest < 100 * healthy:
        problems.append(f"the raw gradient norm falls to {lowest:.2g} between its peaks (control: {healthy:.2g})")
    if largest_update > 0.01:
        problems.append(f"clipping does not bound the updates (ratio up to {largest_update:.2g})")
    if symptoms(ctl):
        problems.append(f"the orthogonal-init control shows {symptoms(ctl)}")
    return lines, problems


@extra("holdout_exploding_steplr_gamma_10_vgg")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    before = max(m.ev.total_grad_norm[:15])
    ctl = control(s, lambda run: setattr(run, "loop", None))
    lines = [
        f"   max total grad norm before the lr jump (steps 0-14): {before:.2g}; control at a constant lr 0.02: "
        f"symptoms {symptoms(ctl)}, loss drop {_loss_drop(ctl.losses):.2f}"
    ]
    problems = [f"gradients already large before the jump ({before:.2g})"] if before > 10 else []
    if symptoms(ctl):
        problems.append(f"the constant-lr control shows {symptoms(ctl)}")
    return lines, problems


@extra("holdout_exploding_grads_never_zeroed_unet")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    norms = m.ev.total_grad_norm[:10]
    growing = all(b > a for a, b in itertools.pairwise(norms))
    ctl = control(s, lambda run: setattr(run, "loop", None))
    lines = [
        f"   stored gradient norm over steps 0-9 (accumulating): {' '.join(f'{g:.2g}' for g in norms)}",
        f"   control with zero_grad() in the loop: max grad norm {max(ctl.total_grad_norm):.2g}, symptoms "
        f"{symptoms(ctl)}, loss drop {_loss_drop(ctl.losses):.2f}",
    ]
    problems = [] if growing else ["the stored gradient norm does not grow step after step"]
    if symptoms(ctl):
        problems.append(f"the control with zero_grad() shows {symptoms(ctl)}")
    return lines, problems


@extra("holdout_grads_zeroed_per_epoch_gru")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    ctl = control(s, lambda run: setattr(run, "loop", None))
    fault, healthy = _loss_drop(m.ev.losses), _loss_drop(ctl.losses)
    cleared = [k for k, n in enumerate(m.ev.carried) if n == 0]
    lines = [
        f"   steps whose backward pass started from cleared gradients: {cleared}; loss last/first {fault:.2f}; "
        f"control with zero_grad() at every step: symptoms {symptoms(ctl)}, loss last/first {healthy:.2f}"
    ]
    problems = []
    if cleared != list(range(0, m.ev.steps, h.ZEROED_EPOCH)):
        problems.append(f"the gradients are cleared at steps {cleared}, not once per epoch")
    if symptoms(ctl) or healthy > 0.8:
        problems.append(f"the control with zero_grad() at every step is not healthy ({symptoms(ctl)}, {healthy:.2f})")
    if not fault > 2 * healthy:
        problems.append(f"zeroing once per epoch does not harm (loss last/first {fault:.2f} vs {healthy:.2f})")
    return lines, problems


@extra("holdout_nonfinite_silent_clip_rms_norm")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    run = s.build()
    problems = []
    for step in range(h.SILENT_STEP + 1):
        x, _ = run.batch(step)
        if not torch.isfinite(x).all():
            problems.append(f"the input of step {step} is not finite")
        silent = int((x.pow(2).mean(dim=(1, 2)) == 0).sum())
        if silent != (1 if step == h.SILENT_STEP else 0):
            problems.append(f"step {step} has {silent} silent clips")
    val = m.run.model.val_losses
    lines = [
        f"   inputs finite at steps 0-{h.SILENT_STEP}; exactly one all-zero clip, at step {h.SILENT_STEP}; "
        f"validation losses (every 10 steps, eval mode): {' '.join(f'{v:.3g}' for v in val)}"
    ]
    if not val or not math.isfinite(val[0]):
        problems.append("no finite validation pass before the fault")
    return lines, problems


@extra("holdout_nonfinite_nan_regression_labels")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    run = s.build()
    x, y = run.batch(h.NAN_LABEL_STEP)
    problems = []
    if not torch.isfinite(x).all():
        problems.append("the inputs of the NaN-label step are not finite")
    if not torch.isnan(y[:, 1]).any() or torch.isnan(y[:, 0]).any():
        problems.append("the NaN is not in the regression labels only")
    lines = [f"   step {h.NAN_LABEL_STEP}: inputs finite, {int(torch.isnan(y).sum())} NaN regression labels"]
    return lines, problems


@extra("holdout_frozen_lazy_param_created_in_forward")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    run = s.build()
    weight = run.model.layers["scale"].weight
    in_opt = id(weight) in _params_of(run.optimizers)
    others = [p for n, p in run.model.named_parameters() if not n.startswith("layers.scale")]
    lines = [
        f"   layers.scale.weight exists after build: requires_grad={weight.requires_grad}, in the optimizer: "
        f"{in_opt}; every other parameter in the optimizer: {all(id(p) in _params_of(run.optimizers) for p in others)}"
    ]
    problems = ["layers.scale.weight is in the optimizer"] if in_opt or not weight.requires_grad else []
    return lines, problems


@extra("holdout_frozen_block_unfrozen_after_optimizer")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    run = s.build()
    params = _params_of(run.optimizers)
    block = list(run.model.blocks[1].parameters())
    lines = [
        f"   blocks.1: {len(block)} tensors, requires_grad all True: {all(p.requires_grad for p in block)}, in "
        f"the optimizer: {sum(id(p) in params for p in block)}; head in the optimizer: "
        f"{all(id(p) in params for p in run.model.head.parameters())}"
    ]
    problems = []
    if any(id(p) in params for p in block) or not all(p.requires_grad for p in block):
        problems.append("blocks.1 is in the optimizer or does not require grad")
    return lines, problems


@extra("holdout_stalled_gan_generator_exponential_lr")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    ratios = m.ev.total_update_ratio
    lines = [f"   generator update/weight ratio, steps 0-7: {' '.join(f'{r:.1e}' for r in ratios[:8])}"]
    return lines, ([] if max(ratios[4:]) < 1e-5 else ["the generator still moves after step 4"])


@extra("holdout_stalled_loss_over_dataset_size")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    ctl = control(s, lambda run: setattr(run, "loss_fn", nn.CrossEntropyLoss()))
    lines = [
        f"   control with the plain mean loss: loss drop {_loss_drop(ctl.losses):.2f}, median update ratio "
        f"{sorted(ctl.total_update_ratio)[len(ctl.total_update_ratio) // 2]:.1e}, symptoms {symptoms(ctl)}"
    ]
    return lines, ([] if _loss_drop(ctl.losses) <= 0.8 and not symptoms(ctl) else ["the control does not learn"])


@extra("holdout_healthy_vgg_bn_eval_passes")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    val = m.run.model.val_losses
    lines = [f"   validation losses (eval mode, no_grad, every 10 steps): {' '.join(f'{v:.3g}' for v in val)}"]
    return lines, ([] if len(val) == 4 and val[-1] < 0.5 * val[0] else ["the validation loss does not fall"])


@extra("holdout_healthy_gan_feature_matching")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    fresh = s.build()
    held_out = [fresh.batch(10_000 + k) for k in range(8)]  # steps the run never trains on
    z = torch.cat([b[0] for b in held_out])
    real = torch.cat([b[1] for b in held_out])

    def distance(gan: nn.Module) -> float:
        with torch.no_grad():
            fake = gan(z)
        return float((fake.mean(0) - real.mean(0)).norm() + (torch.cov(fake.T) - torch.cov(real.T)).norm())

    before, after = distance(fresh.model), distance(m.run.model)
    lines = [f"   generated vs real samples, |mean diff| + |cov diff|_F: {before:.3f} at init -> {after:.3f} trained"]
    return lines, ([] if after < 0.5 * before else ["the generator's samples do not approach the data"])


@extra("holdout_healthy_clipped_lstm_lm")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    active = sum(g > 0.25 for g in m.ev.total_grad_norm) / len(m.ev.total_grad_norm)
    lines = [f"   raw grad norm above the clip threshold 0.25 at {active:.0%} of the steps"]
    return lines, ([] if active >= 0.5 else [f"clipping is active at only {active:.0%} of the steps"])


@extra("holdout_healthy_zero_init_residual")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    ev = m.ev
    branch = [f"layer.{i}.{c}" for i in range(3) for c in ("conv1", "conv2")]
    at0 = {b: ev.grad_norm[b][0] for b in branch}
    later = {b: ev.grad_norm[b][5] for b in branch}
    lines = [f"   branch conv grad norms at step 0: {at0}; at step 5: { {k: f'{v:.2g}' for k, v in later.items()} }"]
    problems = []
    if any(v != 0.0 for v in at0.values()) or any(not v > 0 for v in later.values()):
        problems.append("the zero-init branches do not start gradient-free and then learn")
    return lines, problems


@extra("holdout_healthy_onecycle_warmup_separable")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    ratios = m.ev.total_update_ratio
    lines = [f"   update/weight ratio, steps 0-4: {' '.join(f'{r:.1e}' for r in ratios[:5])} (lr ~1e-5 at step 0)"]
    return lines, ([] if ratios[0] < 1e-4 else ["the first update is not tiny"])


@extra("holdout_healthy_sparse_relu_autoencoder")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    zeros = m.ev.zeros["code_act"]
    lines = [
        f"   code zero elements: {zeros[0]:.0%} at step 0, {zeros[-1]:.0%} at the end; max dead units "
        f"{max(m.ev.dead['code_act']):.0%}"
    ]
    return lines, ([] if zeros[-1] >= 0.5 else ["the code is not sparse"])


@extra("holdout_healthy_bf16_autocast_audio")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    run = m.run
    seen: list[torch.dtype] = []
    handle = run.model.conv2.register_forward_hook(lambda _m, _a, out: seen.append(out.dtype))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        run.model(run.batch(0)[0])
    handle.remove()
    lines = [f"   conv2 output dtype under the loop's autocast: {seen[0]}"]
    return lines, ([] if seen == [torch.bfloat16] else ["the forward does not run in bf16"])


@extra("holdout_healthy_frozen_after_optimizer")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    run = s.build()
    params = _params_of(run.optimizers)
    fixed = [p for p in run.model.parameters() if not p.requires_grad]
    before = [p.detach().clone() for p in fixed]
    trained = [p for p in m.run.model.parameters() if not p.requires_grad]
    unchanged = all(torch.equal(a, b) for a, b in zip(before, trained))
    lines = [
        f"   {len(fixed)} tensors with requires_grad=False, {sum(id(p) in params for p in fixed)} of them in the "
        f"optimizer; unchanged after training: {unchanged}; frozen by design: {m.ev.frozen_by_design}"
    ]
    problems = [] if fixed and all(id(p) in params for p in fixed) and unchanged else ["the set-up is not as described"]
    return lines, problems


@extra("holdout_healthy_fast_fir_fit")
def _(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    losses = m.ev.losses
    lines = [f"   loss {losses[0]:.3g} -> {min(losses):.2e} (minimum), {losses[-1]:.2e} at the end"]
    return lines, ([] if losses[-1] < 1e-3 * losses[0] else ["the fit does not reach a tiny loss"])


def _functional(s: Scenario, m: Measured) -> tuple[Lines, Problems]:
    if not m.functional:
        return [], []
    horizon = m.ev.horizon
    calls_per_step = max(1, len(next(iter(m.functional.values()))) // max(1, m.ev.steps))
    worst = {k: max(v[: horizon * calls_per_step], default=0.0) for k, v in m.functional.items()}
    shown = {k: f"{v:.0%}" for k, v in worst.items()}
    lines = [f"   functional activations, max saturated fraction over the run: {shown}"]
    allowed = "saturated_activations" in (s.truth.kinds | s.truth.may_also)
    bad = [k for k, v in worst.items() if v >= SATURATED_FRACTION]
    return lines, ([] if allowed or not bad else [f"functional activations saturated: {bad}"])


# ---------------------------------------------------------------------------------------------------- check


def evaluate(scenario: Scenario, m: Measured | None = None) -> tuple[list[str], list[str]]:
    """(evidence lines, contradictions) for one held-out scenario; ``m``: its measurement, if already made."""
    m = measure_holdout(scenario) if m is None else m
    lines = report(scenario, m.ev)
    problems = check(scenario, m.ev)
    for fn in (_functional, EXTRAS.get(scenario.name)):
        if fn is not None:
            more_lines, more_problems = fn(scenario, m)
            lines += more_lines
            problems += more_problems
    return lines, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="scenario names (all held-out scenarios when omitted)")
    args = parser.parse_args(argv)
    try:
        chosen = [_BY_NAME[n] for n in args.names] if args.names else SCENARIOS
    except KeyError as exc:
        print(f"benchmarks.holdout_evidence: no held-out scenario {exc.args[0]!r}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # tiny models: one thread is faster than two contended ones
    failures = 0
    for scenario in chosen:
        lines, problems = evaluate(scenario)
        for line in lines:
            print(line)
        for p in problems:
            print(f"   CONTRADICTION: {p}")
        failures += bool(problems)
        print(f"   -> {'OK' if not problems else 'INCONSISTENT'}")
    print(f"{len(chosen) - failures}/{len(chosen)} held-out scenarios consistent with their ground truth")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
