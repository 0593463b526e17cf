"""What the detectors put in the events users read, and structural cases the detection tests do not reach.

Each test here was written against a mutant of the engine that the rest of the suite let through (found with
mutmut): the event's state, confidence, call and step range; a stall's state; two normalisations in a row across
a container boundary; a final sigmoid that is truly saturated.
"""

from __future__ import annotations

import copy
import math

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import EventType, FailureKind, NeuralDbg


def layer_gradients(model: nn.Module) -> dict[str, float]:
    """Plain torch: each module's gradient norm over the parameters it owns directly."""
    out = {}
    for name, module in model.named_modules():
        grads = [p.grad for p in module.parameters(recurse=False) if p.grad is not None]
        if grads:
            out[name] = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
    return out


# ------------------------------------------------------------------------------------- non-finite events


def test_a_nan_batch_is_one_decisive_non_finite_event_that_ends_where_the_batch_does():
    torch.manual_seed(0)
    model = support.mlp()
    clean = support.regression_batches()

    def batches(step: int) -> support.Batch:
        x, y = clean(step)
        if step == 23:
            x = x.clone()
            x[4, 2] = float("nan")
        return x, y

    # plain torch: the batch of step 23 is the only one holding a NaN
    assert [s for s in range(40) if not bool(torch.isfinite(batches(s)[0]).all())] == [23]
    dbg, _ = support.train(model, batches)  # (the weights turn NaN after step 23: later outputs are NaN too)

    (event,) = [e for e in dbg.events if e.event_type is EventType.INPUT]
    assert (event.kind, event.to_state, event.confidence) == (FailureKind.NON_FINITE, "non_finite", 1.0)
    assert (event.step_start, event.step_end) == (23, 23)
    assert "ongoing" not in event.metrics and "call" not in event.metrics  # one step, the model's one input


class SharedTanhNet(nn.Module):
    """One activation module used twice; ``poison`` makes its second use see a NaN at one step."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 1)
        self.act = nn.Tanh()
        self.poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(self.act(self.fc1(x)))
        if self.poison:
            h = h + torch.log(-torch.ones_like(h[:1]))  # NaN born between fc2 and the second use of act
        return self.out(self.act(h))


def test_a_non_finite_value_in_the_second_call_of_a_shared_module_is_reported_at_that_call():
    torch.manual_seed(0)
    model = SharedTanhNet()

    def on_step(step: int, _: torch.optim.Optimizer) -> None:
        model.poison = step == 5

    dbg, losses = support.train(model, support.regression_batches(), steps=6, on_step=on_step)
    assert [s for s, loss in enumerate(losses) if loss != loss] == [5]  # the last step, the only NaN one

    calls = {(e.layer, e.metrics.get("call", 0.0)) for e in dbg.events if e.kind is FailureKind.NON_FINITE}
    assert ("act", 1.0) in calls and ("act", 0.0) not in calls  # the first call of act stayed finite
    assert all(e.to_state == "non_finite" for e in dbg.events if e.kind is FailureKind.NON_FINITE)


# ------------------------------------------------------------------------------------- updates


def test_a_stall_is_reported_in_the_stalled_state_for_the_whole_model():
    torch.manual_seed(0)
    model = support.mlp()
    dbg, _ = support.train(model, support.regression_batches(), optimizer=torch.optim.SGD(model.parameters(), lr=1e-7))
    (stall,) = [e for e in dbg.events if e.kind is FailureKind.STALLED_UPDATES]
    assert (stall.event_type, stall.layer, stall.to_state, stall.from_state) == (EventType.UPDATE, "", "stalled", None)


# ------------------------------------------------------------------------------------- structure


def test_a_norm_ending_a_block_is_cancelled_by_a_batchnorm_right_after_the_block_not_vanishing():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32))  # the block's output is its BatchNorm's
    model = nn.Sequential(block, nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
    batches = support.regression_batches()
    probe = copy.deepcopy(model)
    support.one_backward(probe, batches(0))
    grads = layer_gradients(probe)
    # plain torch: the block's BatchNorm gets a gradient of ~0, the second one divides its affine out again
    assert grads["0.1"] < 1e-4 and grads["0.1"] < 1e-3 * max(grads.values())

    dbg, losses = support.train(model, batches, steps=40, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2))
    assert sum(losses[-5:]) < sum(losses[:5])
    assert dbg.hypotheses() == [], dbg.report()


def test_a_final_sigmoid_pinned_at_its_bounds_is_a_confident_classifier_not_saturation():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())
    with torch.no_grad():
        model[2].weight.mul_(100.0)
    gen = support.classification_batches((16,), 2)

    def batches(step: int) -> support.Batch:
        x, y = gen(step)
        return x, y.float().unsqueeze(1)

    y = support.capture_outputs(model, batches(0)[0], ["3"])["3"]
    assert float(((y < 0.0025) | (y > 0.9975)).float().mean()) > 0.5  # plain torch: most outputs pinned

    dbg, _ = support.train(model, batches, F.binary_cross_entropy, steps=20)
    assert not any(e.kind is FailureKind.SATURATED_ACTIVATIONS for e in dbg.events), dbg.report()


# ------------------------------------------------------------------------------------- evidence: gain, magnitude
#
# Amplifying layers (output rms over 10x the output before it, parametric layers that are not normalisations)
# and anomalous outputs (rms over 1e3) are evidence the explanations quote ("'0' amplifies its input 1.8e+03x").


def rms(t: torch.Tensor) -> float:
    return float(t.norm() / t.numel() ** 0.5)


def blown_up_net() -> nn.Sequential:
    """The first Linear's weights 3000x too large; the second's 1e-5x too small (and no bias), with a BatchNorm
    after it that scales its output back up by ~100x (its job, not a fault)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1)
    )
    with torch.no_grad():
        model[0].weight.mul_(3000.0)
        model[2].weight.mul_(1e-5)
        model[2].bias.zero_()
    return model


def test_amplifying_layers_and_anomalous_outputs_are_the_ones_plain_torch_measures_while_they_last():
    model = blown_up_net()
    x, y = support.regression_batches()(0)
    names = [str(i) for i in range(6)]
    outs = support.capture_outputs(model, x, names)
    before = {names[i]: rms(outs[names[i - 1]]) if i else rms(x) for i in range(6)}
    gain = {n: rms(outs[n]) / before[n] for n in names}
    # plain torch: '0' amplifies ~1e3x; the BatchNorm '3' rescales by more than 10x too; '0' and the ReLU after it
    # put out values of rms > 1e3
    assert gain["0"] > 100 and gain["3"] > 10 and gain["2"] < 1 and gain["5"] < 10
    anomalous = {n for n in names if rms(outs[n]) > 1e3}
    assert anomalous == {"0", "1"}

    def on_step(step: int, _: torch.optim.Optimizer) -> None:
        if step == 8:  # from step 8 both layers are repaired: every state ends at step 7
            with torch.no_grad():
                model[0].weight.div_(3000.0)
                model[2].weight.mul_(1e5)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay as set: the gains are the same
    dbg, _ = support.train(model, lambda step: (x, y), steps=12, optimizer=optimizer, on_step=on_step, preset="full")

    amplifying = [e for e in dbg.events if e.to_state == "amplifying"]
    assert [(e.layer, e.step_start, e.step_end) for e in amplifying] == [("0", 0, 7)]  # not the BatchNorm
    assert amplifying[0].metrics["gain"] == pytest.approx(gain["0"], rel=1e-3)
    assert amplifying[0].metrics["output_rms"] == pytest.approx(rms(outs["0"]), rel=1e-3)
    assert amplifying[0].confidence == 1.0  # over two decades past the threshold, for 8 observations
    found = [e for e in dbg.events if e.to_state == "anomalous"]
    assert {(e.layer, e.step_start, e.step_end) for e in found} == {(n, 0, 7) for n in anomalous}
    for event in found:
        assert event.metrics["output_rms"] == pytest.approx(rms(outs[event.layer]), rel=1e-3)
        # how far past 1e3 on a three-decade scale, and held for 8 observations (full support)
        strength = math.log10(rms(outs[event.layer]) / 1e3) / 3
        assert event.confidence == pytest.approx(round(0.45 + 0.35 * strength + 0.2, 3), abs=1e-3)
        assert "call" not in event.metrics
    for event in (*amplifying, *found):  # seen to end, not still holding at the end of the run
        assert "ongoing" not in event.metrics, event


def test_an_anomalous_output_of_the_second_call_of_a_shared_module_is_reported_at_that_call():
    torch.manual_seed(0)
    model = support.SharedActMLP()
    with torch.no_grad():
        model.fc2.weight.mul_(1e4)  # the second use of `act` puts out values of rms ~1e3-1e4
    x, y = support.regression_batches()(0)
    seen: list[torch.Tensor] = []
    handle = model.act.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    with torch.no_grad():
        model(x)
    handle.remove()
    assert rms(seen[0]) < 10 and rms(seen[1]) > 1e3  # plain torch: only the second call is anomalous

    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    dbg, _ = support.train(model, lambda step: (x, y), steps=6, optimizer=optimizer, preset="full")
    calls = {(e.layer, e.metrics.get("call", 0.0)) for e in dbg.events if e.to_state == "anomalous"}
    assert ("act", 1.0) in calls and ("act", 0.0) not in calls


@pytest.mark.parametrize("scale", [30.0, 300.0])
def test_the_confidence_of_an_amplifying_layer_grows_with_its_gain_on_a_two_decade_scale(scale: float):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    with torch.no_grad():
        model[0].weight.mul_(scale)
    x, y = support.regression_batches()(0)
    gain = rms(support.capture_outputs(model, x, ["0"])["0"]) / rms(x)
    assert 10 < gain < 1000

    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    dbg, _ = support.train(model, lambda step: (x, y), steps=8, optimizer=optimizer, preset="full")
    (event,) = [e for e in dbg.events if e.to_state == "amplifying"]
    # 0 at the threshold (10x), 1 two decades beyond it; held long enough for full support
    strength = min(1.0, math.log10(gain / 10) / 2)
    assert event.confidence == pytest.approx(round(0.45 + 0.35 * strength + 0.2, 3), abs=1e-3)


def test_a_model_fed_token_ids_is_judged_from_its_first_float_output():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(40, 16), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 40))
    with torch.no_grad():
        model[1].weight.mul_(300.0)
    tokens = torch.randint(0, 40, (16,), generator=torch.Generator().manual_seed(1))
    labels = (tokens * 7) % 40
    outs = support.capture_outputs(model, tokens, ["0", "1"])
    assert rms(outs["1"]) / rms(outs["0"]) > 10  # plain torch: '1' amplifies the embeddings

    dbg, _ = support.train(model, lambda step: (tokens, labels), F.cross_entropy, steps=6, preset="full")
    assert [e.layer for e in dbg.events if e.to_state == "amplifying"] == ["1"]  # the embedding has no input rms


# ------------------------------------------------------------------------------------- states that end
#
# A state is closed when its detector looks at the layer again and finds it normal; an event that ended is not
# reported as still holding ("ongoing"), and a later recurrence is a new state.


class Poison(nn.Module):
    """Passes its input through, or makes it NaN while ``on``: a value gone bad inside the model."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.log(-torch.ones_like(x)) if self.on else x


def test_a_layer_non_finite_at_one_step_whose_update_the_scaler_skipped_is_an_event_of_that_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), Poison(), nn.Linear(32, 1))
    batches = support.regression_batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")  # skips the update whose gradients are non-finite
    losses = []
    with NeuralDbg(model) as dbg:
        for step in range(30):
            model[2].on = step == 5
            x, y = batches(step)
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append(loss.item())
    # plain torch: NaN at step 5 only, the weights stayed finite
    assert [s for s, loss in enumerate(losses) if loss != loss] == [5]
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())

    found = [e for e in dbg.events if e.kind is FailureKind.NON_FINITE]
    assert {(e.layer, e.step_start, e.step_end) for e in found} == {("2", 5, 5), ("3", 5, 5)}
    for event in found:
        assert math.isnan(event.metrics["output_norm"]) and "ongoing" not in event.metrics
    assert dbg.hypotheses()[0].root.layer == "2"


class TwoHeads(nn.Module):
    """A main output trained on, and an auxiliary head computed after it that the loss leaves out."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.main, self.aux = nn.Linear(16, 32), nn.Linear(32, 1), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.body(x))
        return self.main(h), self.aux(h)


def test_a_nan_gradient_from_a_finite_loss_on_a_step_between_full_observations_is_found_at_that_step():
    torch.manual_seed(0)
    model = TwoHeads()
    batches = support.regression_batches()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    grads_finite = []
    with NeuralDbg(model) as dbg:  # default schedule: steps 16-31 but 16 are cheap
        for step in range(30):
            x, y = batches(step)
            opt.zero_grad()
            out, _ = model(x)
            # at step 21 the loss is sqrt(0) = 0: finite, with a NaN gradient
            loss = F.mse_loss(out, y) if step != 21 else torch.sqrt(((out - y) ** 2).sum() * 0.0)
            scaler.scale(loss).backward()
            grads_finite.append(bool(torch.isfinite(model.main.weight.grad).all()) and math.isfinite(loss.item()))
            scaler.step(opt)
            scaler.update()
    assert [s for s, ok in enumerate(grads_finite) if not ok] == [21]  # plain torch

    (event,) = [e for e in dbg.events if e.kind is FailureKind.NON_FINITE]
    assert (event.event_type, event.step_start, event.step_end) == (EventType.LOSS, 21, 21)


# ------------------------------------------------------------------------------------- saturation


def saturated_fraction(y: torch.Tensor, derivative: float = 1e-2) -> float:
    """Plain torch: the fraction of tanh outputs where tanh' = 1 - y^2 is below ``derivative``."""
    return float((y.abs() >= math.sqrt(1 - derivative)).float().mean())


def test_a_saturated_hidden_tanh_is_reported_with_its_fraction_while_it_lasts():
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=2, act=nn.Tanh)
    with torch.no_grad():
        model[0].weight.mul_(20.0)
    x, y = support.regression_batches()(0)
    out = support.capture_outputs(model, x, ["1"])["1"]
    fraction = saturated_fraction(out)
    assert 0.5 < fraction < 1.0  # plain torch

    def on_step(step: int, _: torch.optim.Optimizer) -> None:
        if step == 8:
            with torch.no_grad():
                model[0].weight.div_(20.0)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    dbg, _ = support.train(model, lambda step: (x, y), steps=12, optimizer=optimizer, on_step=on_step, preset="full")
    (event,) = [e for e in dbg.events if e.kind is FailureKind.SATURATED_ACTIVATIONS]
    assert (event.layer, event.step_start, event.step_end, event.to_state) == ("1", 0, 7, "saturated")
    assert event.metrics["saturated_fraction"] == pytest.approx(fraction, abs=1e-6)
    assert event.metrics["elements"] == out.numel()
    assert "ongoing" not in event.metrics and "call" not in event.metrics
    strength = (fraction - 0.5) / 0.5  # 0 at half the layer, 1 at all of it; 8 observations: full support
    assert event.confidence == pytest.approx(round(0.45 + 0.35 * strength + 0.2, 3), abs=1e-3)


def test_a_tanh_with_a_minority_of_saturated_outputs_is_not_reported():
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=2, act=nn.Tanh)
    with torch.no_grad():
        model[0].weight.mul_(4.0)
    x, y = support.regression_batches()(0)
    assert 0.05 < saturated_fraction(support.capture_outputs(model, x, ["1"])["1"]) < 0.5  # plain torch

    dbg, _ = support.train(model, lambda step: (x, y), steps=8, optimizer=torch.optim.SGD(model.parameters(), lr=0.0))
    assert not any(e.kind is FailureKind.SATURATED_ACTIVATIONS for e in dbg.events), dbg.report()


class SharedTanhMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 1)
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


def test_a_shared_tanh_saturated_at_its_second_call_only_is_reported_at_that_call():
    torch.manual_seed(0)
    model = SharedTanhMLP()
    with torch.no_grad():
        model.fc2.weight.mul_(30.0)
    x, y = support.regression_batches()(0)
    seen: list[torch.Tensor] = []
    handle = model.act.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    with torch.no_grad():
        model(x)
    handle.remove()
    assert saturated_fraction(seen[0]) < 0.5 < saturated_fraction(seen[1])  # plain torch

    dbg, _ = support.train(model, lambda step: (x, y), steps=8, optimizer=torch.optim.SGD(model.parameters(), lr=0.0))
    saturated = [e for e in dbg.events if e.kind is FailureKind.SATURATED_ACTIVATIONS]
    assert [(e.layer, e.metrics.get("call")) for e in saturated] == [("act", 1.0)]


# ------------------------------------------------------------------------------------- more evidence


class LogOutput(nn.Module):
    """The model's own forward code makes the NaN: no submodule's output is non-finite."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(self.fc(x) - 100.0)


def test_a_nan_made_by_the_models_own_forward_code_is_blamed_on_the_model_output():
    torch.manual_seed(0)
    model = LogOutput()
    x, y = support.regression_batches()(0)
    with torch.no_grad():
        assert bool(torch.isfinite(model.fc(x)).all()) and not bool(torch.isfinite(model(x)).all())  # plain torch

    # one step: after it the NaN gradient has reached the weights (even at learning rate 0: 0 x NaN is NaN)
    dbg, _ = support.train(model, lambda step: (x, y), steps=1, optimizer=torch.optim.SGD(model.parameters(), lr=0.0))
    found = [e for e in dbg.events if e.kind is FailureKind.NON_FINITE and e.event_type is EventType.ACTIVATION]
    assert [e.layer for e in found] == [""], found  # not 'fc', whose output is finite (its gradient is not)
    assert math.isnan(found[0].metrics["output_norm"])


def test_an_anomalous_single_value_output_is_reported():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    with torch.no_grad():
        model[2].weight.mul_(1e5)
    x, y = support.regression_batches(batch=1)(0)  # one sample, one output: a single value
    out = support.capture_outputs(model, x, ["2"])["2"]
    assert out.numel() == 1 and float(out.abs()) > 1e3  # plain torch

    dbg, _ = support.train(model, lambda step: (x, y), steps=6, optimizer=torch.optim.SGD(model.parameters(), lr=0.0))
    assert ("2", 0) in {(e.layer, e.step_start) for e in dbg.events if e.to_state == "anomalous"}


# ------------------------------------------------------------------------------------- confidence scales


def full_support_confidence(strength: float, observations: float) -> float:
    return round(min(1.0, 0.45 + 0.35 * strength + 0.2 * min(1.0, observations / 6)), 3)


def test_the_confidence_of_a_stall_reads_how_far_below_the_stalled_ratio_its_updates_are():
    torch.manual_seed(0)
    model = support.mlp()
    dbg, _ = support.train(model, support.regression_batches(), optimizer=torch.optim.SGD(model.parameters(), lr=3e-6))
    (stall,) = [e for e in dbg.events if e.kind is FailureKind.STALLED_UPDATES]
    median = stall.metrics["median_update_ratio"]
    assert 1e-8 < median < 1e-5  # between the threshold and three decades below it
    strength = math.log10(1e-5 / median) / 3
    assert stall.confidence == full_support_confidence(strength, stall.metrics["observations"])


def test_the_confidence_of_a_vanishing_gradient_reads_how_far_below_the_threshold_it_is():
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=14, act=nn.Sigmoid)
    dbg, _ = support.train(model, support.regression_batches(), optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    vanishing = [
        e for e in dbg.events if e.kind is FailureKind.VANISHING_GRADIENTS and e.metrics.get("exact_zero") is None
    ]
    assert vanishing
    for event in vanishing:
        strength = min(1.0, math.log10(1e-4 / event.metrics["grad_norm"]) / 6)
        assert event.confidence == full_support_confidence(strength, event.metrics["observations"]), event
