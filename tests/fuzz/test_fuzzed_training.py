"""Property-based fuzzing: random models and loops (``fuzz_models``) trained with and without NeuralDBG.

Two properties over every drawn run:

* the debugger never changes or breaks a run: no exception, no ``NeuralDbgWarning``, final parameters, buffers
  and losses bit-identical to a run without it, every hook it installed removed (module, tensor and global
  optimizer hooks), and the model garbage-collected once the user lets go of it;
* its diagnosis agrees with a plain-torch oracle (``fuzz_oracle``): no hypothesis on a run the oracle confirms
  healthy, and the fault named on a run it confirms faulty. Runs it can confirm neither way are discarded (the
  session summary reports how many).

Profiles (``conftest.py``): 50 derandomized examples by default, ``--hypothesis-profile=long`` for 500. The
runs the long profile found confirmed faulty are kept as explicit cases, so every profile checks them.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from typing import Any

import pytest
import torch
import torch.nn.modules.module as torch_module
import torch.optim.optimizer as torch_optimizer
from fuzz_campaign import CAMPAIGN
from fuzz_models import RunSpec, build, describe, run_specs, train
from fuzz_oracle import FAULTY, HEALTHY, judge
from hypothesis import given
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.errors import NeuralDbgWarning

_MODULE_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
)


def global_hooks() -> dict[str, int]:
    """How many hooks torch holds for every module and every optimizer."""
    names = [n for n in dir(torch_module) if n.startswith("_global_") and n.endswith("hooks")]
    counts = {n: len(getattr(torch_module, n)) for n in names}
    optimizer_hooks = [n for n in dir(torch_optimizer) if n.startswith("_global_optimizer")]
    counts.update({n: len(getattr(torch_optimizer, n)) for n in optimizer_hooks})
    return counts


def hooks_left(model: nn.Module) -> list[str]:
    """Every module or parameter hook still attached to ``model``."""
    left = []
    for name, m in model.named_modules():
        for attr in _MODULE_HOOKS:
            if getattr(m, attr, None):
                left.append(f"{name or 'model'}.{attr}")
    for name, p in model.named_parameters():
        if p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None):
            left.append(f"{name} tensor hook")
    return left


def final_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def watched_run(spec: RunSpec) -> tuple[NeuralDbg | None, dict[str, Any]]:
    """Train ``spec`` under NeuralDbg; returns the debugger and what the non-interference checks need. The run's
    objects are dropped before returning, so the model can be collected."""
    run = build(spec)
    model_ref = weakref.ref(run.model)
    before = global_hooks()
    out: dict[str, Any] = {}
    dbg = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with NeuralDbg(run.model) as dbg:
                out["losses"] = train(run)
        except Exception as exc:
            out["error"] = exc
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, NeuralDbgWarning)]
    out["state"] = final_state(run.model)
    out["hooks"] = hooks_left(run.model) + [n for n, c in global_hooks().items() if c != before.get(n)]
    del run
    if model_ref() is not None:  # freed by reference counting in every run so far; a cycle needs the collector
        gc.collect()
    out["collected"] = model_ref() is None
    return dbg, out


@given(run_specs())
def test_the_debugger_never_changes_or_breaks_a_fuzzed_run(spec: RunSpec) -> None:
    plain = build(spec)
    plain_losses = train(plain)
    reference = final_state(plain.model)
    del plain

    dbg, out = watched_run(spec)

    same = "error" not in out and out["losses"] == plain_losses and bit_identical(out["state"], reference)
    checks = {
        "no_crash": "error" not in out,
        "no_warning": not out["warnings"],
        "bit_identical": same,
        "hooks_removed": not out["hooks"],
        "collected": out["collected"],
    }
    CAMPAIGN.watched(spec, **checks)
    if "error" in out:
        raise out["error"]
    assert not out["warnings"], describe(spec)
    assert checks["bit_identical"], f"the debugger changed the run: {describe(spec)}"
    assert not out["hooks"], f"hooks left behind: {out['hooks']}"
    assert out["collected"], "the debugger kept the model alive after its block"
    assert dbg is not None and dbg.steps == spec.steps
    dbg.hypotheses()  # it still answers without the model


def diagnose(spec: RunSpec, record: bool = True) -> tuple[str, set[str], list[str], str]:
    """(oracle label, oracle kinds not named, the engine's hypotheses, the oracle's reasons) for one run;
    ``record``: count it in the session's figures (drawn runs only)."""
    verdict, _, _ = judge(build(spec))
    run = build(spec)
    with NeuralDbg(run.model) as dbg:
        train(run)
    hypotheses = dbg.hypotheses()
    named = {h.kind.value for h in hypotheses} | {e.kind.value for h in hypotheses for e in h.chain if e.kind}
    found = verdict.kinds <= named if verdict.label == FAULTY else None
    if record:
        CAMPAIGN.judged(spec, verdict.label, [h.summary() for h in hypotheses], verdict.kinds, found)
    return verdict.label, verdict.kinds - named, [h.summary() for h in hypotheses], str(verdict)


#: Runs the oracle confirmed faulty in the long profile, kept so every profile checks that their faults are named.
FOUND_FAULTY = [
    RunSpec(  # vanishing: an LSTM branch, a sigmoid and a BatchNorm over two time steps, one sample a step
        seed=0,
        domain="sequence",
        width=8,
        body=(("residual", ("shared_relu", ("nested", ("lstm", "relu")))), "sigmoid", "bn"),
        neck=("silu", "tanh"),
        task="regression",
        outputs=4,
        wrap="plain",
        optimizer="adam",
        lr=0.001,
        scheduler="cosine",
        batch=1,
        accumulation=1,
        steps=16,
        length=2,
        closure=True,
    ),
    RunSpec(  # vanishing: a narrow ReLU chain into a BatchNorm, one sample a step
        seed=2984,
        domain="sequence",
        width=4,
        body=("shared_relu", "relu", ("nested", ("leaky_relu0", "bn"))),
        neck=("relu",),
        task="classification",
        outputs=3,
        wrap="dict",
        optimizer="adam",
        lr=0.003,
        scheduler="exponential",
        batch=1,
        accumulation=1,
        steps=17,
        length=4,
    ),
    RunSpec(  # non-finite: SGD at lr 0.05 through a sigmoid and two wide linears
        seed=94,
        domain="sequence",
        width=32,
        body=(("residual", ("relu",)), "linear", "sigmoid", "leaky_relu0", "linear"),
        neck=(("residual", ("ln",)),),
        task="regression",
        outputs=2,
        wrap="plain",
        optimizer="sgd",
        lr=0.05,
        scheduler="none",
        batch=3,
        accumulation=1,
        steps=20,
        length=4,
    ),
]


@given(run_specs())
def test_fuzzed_runs_confirmed_healthy_get_no_hypothesis_and_confirmed_faults_are_named(spec: RunSpec) -> None:
    label, missed, hypotheses, reasons = diagnose(spec)
    if label == HEALTHY:
        assert hypotheses == [], f"false alarm on a run plain torch confirms healthy: {describe(spec)}"
    elif label == FAULTY:
        assert not missed, f"{sorted(missed)} not named ({hypotheses}); oracle: {reasons}; {describe(spec)}"


@pytest.mark.parametrize("spec", FOUND_FAULTY, ids=["lstm-sigmoid-bn", "narrow-relu-bn", "sgd-non-finite"])
def test_faulty_runs_found_by_fuzzing_stay_confirmed_faulty_and_named(spec: RunSpec) -> None:
    label, missed, hypotheses, reasons = diagnose(spec, record=False)
    assert label == FAULTY, reasons
    assert not missed, f"{sorted(missed)} not named ({hypotheses}); oracle: {reasons}"
