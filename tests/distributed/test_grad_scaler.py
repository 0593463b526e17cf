"""Mixed precision with a GradScaler: statistics read unscaled, skipped steps counted, a collapsing scale found.

Float16 autocast on the CPU, ``torch.amp.GradScaler("cpu")``. Ground truth is plain torch: a step was skipped
when the scaler's scale went down (``scaler.get_scale()`` before and after) and the weights did not move; the
unscaled gradients are read after an explicit ``scaler.unscale_(optimizer)``, the loss gradient is computed
from the model's output (mean squared error: ``2 (y - t) / n``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from neuraldbg import EventType, FailureKind, NeuralDbg, hookimpl
from neuraldbg.detectors import Detector, StepView

pytestmark = pytest.mark.filterwarnings("ignore:.*autocast.*:UserWarning")


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))


def batch(step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randn(16, 8, generator=g)
    return x, x[:, :1] * 2 - x[:, 1:2]


@dataclass
class Truth:
    """What plain torch saw of the run."""

    scales: list[float] = field(default_factory=list)  # the scale each step used
    skipped: list[int] = field(default_factory=list)  # steps the scaler skipped
    grad_norms: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> layer -> unscaled norm
    loss_grads: dict[int, float] = field(default_factory=dict)  # step -> ||d loss / d output||
    losses: dict[int, float] = field(default_factory=dict)  # step -> the loss before scaling (last micro-batch)


def train(
    model: nn.Module,
    scaler: torch.amp.GradScaler,
    dbg: NeuralDbg | None,
    steps: int,
    *,
    dtype: torch.dtype = torch.float16,
    accumulate: int = 1,
    poison: dict[int, str] | None = None,
    loss_factor: float = 1.0,
    adam: bool = False,
    fused: bool = False,
) -> Truth:
    """A standard AMP loop; ``poison`` maps steps to "nan_input", "nan_loss" or "overflow" (every gradient
    overflows float16 whatever the scale: the loss is multiplied by 1e30). ``loss_factor`` scales the loss (a
    smaller loss lets the scaler settle on a larger scale; Adam's steps do not shrink with it)."""
    poison = poison or {}
    truth = Truth()
    if adam or fused:
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused or None)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with dbg if dbg is not None else _nothing():
        for step in range(steps):
            truth.scales.append(scaler.get_scale())
            before = [p.detach().clone() for p in model.parameters()]
            opt.zero_grad()
            for micro in range(accumulate):
                x, y = batch(step, micro)
                if poison.get(step) == "nan_input":
                    x[3, 2] = float("nan")
                with torch.autocast("cpu", dtype=dtype):
                    out = model(x)
                    loss = nn.functional.mse_loss(out.float(), y) * loss_factor
                error = 2 * loss_factor * (out.detach().float() - y) / y.numel()
                truth.loss_grads[step] = float(torch.linalg.vector_norm(error))
                truth.losses[step] = float(loss.detach())
                if poison.get(step) == "nan_loss":
                    loss = loss * float("nan")
                if poison.get(step) == "overflow":
                    loss = loss * 1e30
                scaler.scale(loss / accumulate).backward()
            if not fused:  # a fused optimizer unscales in its own kernel
                scaler.unscale_(opt)
            truth.grad_norms[step] = {
                name: math.sqrt(sum(float(torch.linalg.vector_norm(p.grad)) ** 2 for p in layer.parameters()))
                for name, layer in model.named_children()
                if any(True for _ in layer.parameters())
            }
            scaler.step(opt)
            scaler.update()
            if scaler.get_scale() < truth.scales[-1]:
                assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # nothing moved
                truth.skipped.append(step)
    return truth


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def kinds(dbg: NeuralDbg) -> list[FailureKind]:
    return [h.kind for h in dbg.hypotheses()]


# --- skipped steps are the scaler's job, not a failure ---------------------------------------------------------


@pytest.mark.parametrize("passed", [True, False], ids=["scaler passed", "scaler found"])
def test_a_float16_run_whose_scaler_skips_its_first_steps_is_healthy_and_the_skips_are_counted(passed):
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
    dbg = NeuralDbg(model, grad_scaler=scaler if passed else None)
    truth = train(model, scaler, dbg, 40)
    assert len(truth.skipped) >= 5 and truth.skipped[0] == 0  # the scale really was too high at first
    assert dbg.hypotheses() == []
    assert dbg.steps == 40
    facts = dbg.meta["grad_scaler"]
    assert facts["skipped_steps"] == len(truth.skipped)
    assert facts["first_skipped_steps"] == truth.skipped
    scales = dict(dbg.history.get("loss_scale", "").points())
    assert scales[39] == truth.scales[39]
    first_applied = next(s for s in range(40) if s not in truth.skipped)
    loss_grads = dict(dbg.history.get("loss_gradient", "").points())
    assert first_applied in loss_grads  # read before a scaler found at that step's optimizer step: unscaled too
    for step, value in loss_grads.items():
        assert step not in truth.skipped
        assert value == pytest.approx(truth.loss_grads[step], rel=2e-3), step


@pytest.mark.parametrize("passed", [True, False], ids=["scaler passed", "scaler found"])
def test_the_loss_of_each_skipped_step_is_divided_by_the_scale_that_step_used(passed):
    # found at the first step it does not skip, the scaler's scale has been halved once per skip by then: each held
    # step's recorded loss is divided by its own scale, not by that later one (which would make step 0's loss
    # 2**skips times too large)
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
    dbg = NeuralDbg(model, grad_scaler=scaler if passed else None)
    truth = train(model, scaler, dbg, 12)
    assert len(truth.skipped) >= 5 and truth.skipped[:3] == [0, 1, 2]
    losses = dict(dbg._recorder.coverage.losses.first)
    assert sorted(losses) == list(range(12))
    for step in range(12):
        assert losses[step] == pytest.approx(truth.losses[step], rel=1e-3), step


@pytest.mark.parametrize("passed", [True, False], ids=["scaler passed", "scaler found"])
def test_a_fused_optimizer_that_unscales_in_its_own_kernel_is_read_unscaled_and_its_skips_counted(passed):
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
    dbg = NeuralDbg(model, grad_scaler=scaler if passed else None, preset="full")
    truth = train(model, scaler, dbg, 30, fused=True)
    assert len(truth.skipped) >= 5  # the kernel left the weights alone on these steps
    assert dbg.hypotheses() == []
    assert dbg.meta["grad_scaler"]["first_skipped_steps"] == truth.skipped
    series = dict(dbg.history.get("grad_norm", "0").points())
    applied = [s for s in range(30) if s not in truth.skipped]
    assert sorted(series) == applied  # skipped steps carry no gradient reading
    for step in applied:  # truth: the scaled gradients after the step, divided by the scale they carried
        assert series[step] == pytest.approx(truth.grad_norms[step]["0"] / truth.scales[step], rel=1e-4), step


def test_gradient_statistics_are_read_unscaled_at_every_step_including_step_0():
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    dbg = NeuralDbg(model, grad_scaler=scaler, preset="full")
    truth = train(model, scaler, dbg, 12)
    assert 0 not in truth.skipped and truth.scales[0] == 2.0**12
    observed = [s for s in range(12) if s not in truth.skipped]
    for layer in ("0", "2", "4"):
        series = dict(dbg.history.get("grad_norm", layer).points())
        for step in observed:
            assert series[step] == pytest.approx(truth.grad_norms[step][layer], rel=1e-4), (layer, step)
    loss_grads = dict(dbg.history.get("loss_gradient", "").points())
    for step in observed:  # the scaled float16 gradient, unscaled: equal up to float16 rounding
        assert loss_grads[step] == pytest.approx(truth.loss_grads[step], rel=2e-3), step


def test_gradient_accumulation_under_a_scaler_is_not_taken_for_skipped_steps():
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
    dbg = NeuralDbg(model, grad_scaler=scaler)
    truth = train(model, scaler, dbg, 24, accumulate=3)
    assert truth.skipped[:2] == [0, 1] and len(truth.skipped) < 24
    assert dbg.steps == 24  # one step per iteration of three micro-batches, skipped or not
    assert dbg.meta["grad_scaler"]["first_skipped_steps"] == truth.skipped
    assert dbg.hypotheses() == []


# --- a scale that keeps collapsing is a failure ------------------------------------------------------------------


def test_a_scale_that_never_recovers_is_a_loss_scale_collapse():
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**60)
    dbg = NeuralDbg(model, grad_scaler=scaler)
    start = [p.detach().clone() for p in model.parameters()]
    truth = train(model, scaler, dbg, 24)
    assert truth.skipped == list(range(24))  # the scale halved every step and never fit float16
    assert all(torch.equal(a, b) for a, b in zip(start, model.parameters()))
    (hypothesis,) = dbg.hypotheses()
    assert hypothesis.kind is FailureKind.LOSS_SCALE_COLLAPSE
    root = hypothesis.root
    assert (root.event_type, root.step_start, root.step_end) == (EventType.RUN, 0, 23)
    assert root.metrics["skipped_steps"] == 24
    assert root.metrics["skipped_in_window"] == root.metrics["window_steps"] == 16
    assert root.metrics["loss_scale"] == truth.scales[-1]
    assert "16 of the last 16 steps skipped" in root.detail
    assert hypothesis.explanation.startswith("Loss-scale collapse: the GradScaler skipped 24 of 24 observed steps")
    assert "init_scale" in hypothesis.suggestion


def test_skips_that_resume_mid_run_for_more_than_16_steps_are_a_loss_scale_collapse():
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**30)
    dbg = NeuralDbg(model, grad_scaler=scaler)
    truth = train(model, scaler, dbg, 60, poison=dict.fromkeys(range(30, 48), "overflow"), loss_factor=1e-5, adam=True)
    late = [s for s in truth.skipped if s >= 30]
    assert late == list(range(30, 48)) and min(truth.scales) > 1  # 18 skips in a row, the scale never under 1
    assert not [s for s in truth.skipped if s > 48]  # then it trained again
    (hypothesis,) = dbg.hypotheses()
    assert hypothesis.kind is FailureKind.LOSS_SCALE_COLLAPSE
    assert (hypothesis.root.step_start, hypothesis.root.step_end) == (30, 47)
    assert "18 steps in a row skipped (steps 30-47)" in hypothesis.root.detail


def test_a_scale_backed_off_below_1_is_a_loss_scale_collapse_even_when_steps_succeed_again():
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0, growth_interval=10_000)
    dbg = NeuralDbg(model, grad_scaler=scaler)
    truth = train(model, scaler, dbg, 30, poison=dict.fromkeys(range(4), "overflow"))
    assert truth.skipped == [0, 1, 2, 3] and truth.scales[-1] == 0.125  # four skips, never again
    (hypothesis,) = dbg.hypotheses()
    assert hypothesis.kind is FailureKind.LOSS_SCALE_COLLAPSE
    assert hypothesis.root.metrics["min_scale"] == 0.125
    assert "the scale backed off below 1" in hypothesis.root.detail


def test_a_scale_set_below_1_by_the_user_and_never_backed_off_is_not_a_collapse():
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=0.5, growth_interval=10_000)
    dbg = NeuralDbg(model, grad_scaler=scaler)
    truth = train(model, scaler, dbg, 20)
    assert truth.skipped == [] and truth.scales[-1] == 0.5
    assert dbg.hypotheses() == []


# --- a failure before scaling is still a failure ---------------------------------------------------------------


def test_a_nan_input_batch_under_a_scaler_is_non_finite_at_that_step():
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    dbg = NeuralDbg(model, grad_scaler=scaler)
    truth = train(model, scaler, dbg, 30, poison={17: "nan_input"})
    assert 17 in truth.skipped  # the scaler skipped the poisoned step, as it should
    first = dbg.hypotheses()[0]
    assert first.kind is FailureKind.NON_FINITE
    assert (first.root.event_type, first.root.step_start) == (EventType.INPUT, 17)


@pytest.mark.parametrize("step", [8, 21], ids=["fully observed step", "cheap step"])
def test_a_nan_loss_from_finite_outputs_under_a_scaler_is_non_finite_at_that_step(step):
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    dbg = NeuralDbg(model, grad_scaler=scaler)
    truth = train(model, scaler, dbg, 30, poison={step: "nan_loss"})
    assert truth.skipped == [step]
    (hypothesis,) = dbg.hypotheses()
    assert hypothesis.kind is FailureKind.NON_FINITE
    assert (hypothesis.root.event_type, hypothesis.root.step_start) == (EventType.LOSS, step)


def test_gradients_that_overflow_float16_on_steps_the_scaler_skips_are_not_non_finite():
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    dbg = NeuralDbg(model, grad_scaler=scaler)
    truth = train(model, scaler, dbg, 30, poison={5: "overflow", 20: "overflow"})  # one full step, one cheap
    assert truth.skipped == [5, 20]
    assert dbg.hypotheses() == []
    assert dbg.meta["grad_scaler"]["first_skipped_steps"] == [5, 20]


class LossGradientProbe(Detector):
    """A plugin detector that sees every step (cheap ones too) and keeps the loss gradient the engine read."""

    name = "loss_gradient_probe"

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}

    def observe(self, view: StepView) -> None:
        if view.data.target_grad is not None:
            self.seen[view.step] = view.data.target_grad


class Probe:
    def __init__(self) -> None:
        self.detector = LossGradientProbe()

    @hookimpl
    def neuraldbg_detectors(self, config: object) -> list[Detector]:
        return [self.detector]


def test_the_loss_gradient_is_read_unscaled_on_cheap_steps_too():
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    probe = Probe()
    dbg = NeuralDbg(model, grad_scaler=scaler, plugins=[probe])
    truth = train(model, scaler, dbg, 40)
    cheap = [s for s in range(17, 40) if s not in (32,) and s not in truth.skipped]
    assert cheap and set(cheap) <= set(probe.detector.seen)
    for step in cheap:
        assert probe.detector.seen[step] == pytest.approx(truth.loss_grads[step], rel=2e-3), step


def test_gradients_read_after_a_scaled_backward_pass_with_no_optimizer_step_are_unscaled():
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    truth: dict[int, float] = {}
    with NeuralDbg(model, grad_scaler=scaler) as dbg:  # gradients only: nothing is ever stepped
        for step in range(6):
            model.zero_grad()
            x, y = batch(step)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            truth[step] = math.sqrt(sum(float(p.grad.norm()) ** 2 for p in model[0].parameters())) / 2.0**12
    assert dbg.step_mode == "backward"
    series = dict(dbg.history.get("grad_norm", "0").points())
    for step, expected in truth.items():
        assert series[step] == pytest.approx(expected, rel=1e-4), step


# --- bfloat16, and the run itself -------------------------------------------------------------------------------


@pytest.mark.parametrize("with_scaler", [True, False], ids=["with a scaler", "without a scaler"])
def test_bfloat16_autocast_stays_healthy(with_scaler):
    model = make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, enabled=with_scaler)
    dbg = NeuralDbg(model, grad_scaler=scaler if with_scaler else None)
    truth = train(model, scaler, dbg, 30, dtype=torch.bfloat16)
    assert truth.skipped == []
    assert dbg.hypotheses() == [] and dbg.steps == 30


def test_the_debugger_leaves_a_scaled_run_bit_identical():
    runs = []
    for watched in (False, True):
        model = make_model()
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
        train(model, scaler, NeuralDbg(model, grad_scaler=scaler) if watched else None, 25)
        runs.append([p.detach().clone() for p in model.parameters()] + [torch.tensor(scaler.get_scale())])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_a_float16_norm_is_read_in_float32_where_float16_would_overflow():
    from neuraldbg.stats import tensors as stats

    t = torch.full((16,), 30000.0, dtype=torch.float16)  # every element finite, the norm 120000 > 65504
    assert not torch.isfinite(torch.linalg.vector_norm(t))  # plain torch in float16: inf
    assert stats.host_norm(t) == pytest.approx(120000.0)
    assert float(stats.norms([t])[0]) == pytest.approx(120000.0)


def test_distributed_and_mixed_precision_options_that_are_wrong_are_refused_naming_the_option():
    from neuraldbg import ConfigError

    with pytest.raises(ConfigError, match=r"grad_scaler=\.\.\.\): expected a torch\.amp\.GradScaler, got float"):
        NeuralDbg(make_model(), grad_scaler=65536.0)
    with pytest.raises(ConfigError, match=r"gather=\.\.\.\): expected true or false, got 'yes'"):
        NeuralDbg(make_model(), gather="yes")
    with pytest.raises(ConfigError, match=r"gather_timeout=\.\.\.\): expected a positive number of seconds, got 0"):
        NeuralDbg(make_model(), gather_timeout=0)
    with pytest.raises(ConfigError, match=r"gather\(timeout=\.\.\.\): expected a positive number of seconds, got nan"):
        NeuralDbg(make_model()).gather(timeout=float("nan"))
    assert NeuralDbg(make_model()).gather() is None  # not a distributed job: nothing to gather
