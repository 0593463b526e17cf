"""The debugger must never break or change the training it observes, whatever the model looks like."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

import neuraldbg
from neuraldbg import ConfigError, FailureKind, NeuralDbg, NeuralDbgError, NeuralDbgWarning


def hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


def optimizer_hook_count() -> int:
    from torch.optim import optimizer as opt_module

    return len(opt_module._global_optimizer_pre_hooks) + len(opt_module._global_optimizer_post_hooks)


# --------------------------------------------------------------------------------------------- no change


def _adam_dropout_run(watch: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(inplace=True), nn.Dropout(0.3), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = support.regression_batches()
    ctx = NeuralDbg(model, preset="full") if watch else None
    if ctx:
        ctx.attach()
    try:
        for step in range(25):
            x, y = batches(step)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    finally:
        if ctx:
            ctx.close()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_parameters_are_bit_identical_with_and_without_the_debugger():
    plain = _adam_dropout_run(watch=False)
    watched = _adam_dropout_run(watch=True)
    for name in plain:
        assert torch.equal(plain[name], watched[name]), name


def test_every_hook_is_removed_on_normal_exit():
    model = support.mlp()
    before, before_opt = hook_count(model), optimizer_hook_count()
    support.train(model, support.regression_batches(), steps=3)
    assert hook_count(model) == before
    assert optimizer_hook_count() == before_opt


def test_a_user_exception_propagates_unchanged_and_hooks_are_removed():
    model = support.mlp()
    before, before_opt = hook_count(model), optimizer_hook_count()
    boom = RuntimeError("user code failed")
    with pytest.raises(RuntimeError) as info, NeuralDbg(model):
        model(torch.randn(4, 16)).sum().backward()
        raise boom
    assert info.value is boom
    assert hook_count(model) == before
    assert optimizer_hook_count() == before_opt


def test_keyboard_interrupt_propagates_and_hooks_are_removed():
    model = support.mlp()
    before = hook_count(model)
    with pytest.raises(KeyboardInterrupt), NeuralDbg(model) as dbg:
        model(torch.randn(4, 16)).sum().backward()
        raise KeyboardInterrupt
    assert hook_count(model) == before
    assert not dbg.attached


def test_a_failure_inside_the_engine_is_a_warning_and_training_goes_on(monkeypatch: pytest.MonkeyPatch):
    from neuraldbg import stats

    def broken(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("statistics exploded")

    monkeypatch.setattr(stats, "dead_units", broken)
    model = support.mlp()
    reference = copy.deepcopy(model)
    with pytest.warns(NeuralDbgWarning, match="statistics exploded"):
        dbg, losses = support.train(model, support.regression_batches(), steps=10)
    plain = support.plain_train(reference, support.regression_batches(), steps=10)
    assert losses == plain
    assert hook_count(model) == 0
    # a run the debugger stopped observing is never "healthy": the verdict says what was not observed and why
    (found,) = dbg.hypotheses()
    assert found.kind is FailureKind.INCOMPLETE_OBSERVATION
    assert "statistics exploded" in found.root.detail


def test_a_failing_plugin_detector_is_disabled_with_a_warning():
    from neuraldbg.detectors import Detector

    class Broken(Detector):
        name = "broken"

        def observe(self, view: object) -> None:
            raise ValueError("plugin bug")

    class Plugin:
        @neuraldbg.hookimpl
        def neuraldbg_detectors(self, config: object) -> list[Detector]:
            return [Broken()]

    model = support.mlp()
    with pytest.warns(NeuralDbgWarning, match="plugin bug"), NeuralDbg(model, plugins=[Plugin()]) as dbg:
        for step in range(3):
            x, y = support.regression_batches()(step)
            F.mse_loss(model(x), y).backward()
    assert dbg.steps == 3


# --------------------------------------------------------------------------------------------- model shapes


def test_in_place_relu_is_handled_and_diagnosed():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(inplace=True), nn.Linear(32, 32), nn.ReLU(inplace=True), nn.Linear(32, 1)
    )
    with torch.no_grad():
        model[2].bias.fill_(-30.0)
    dbg, _ = support.train(model, support.regression_batches())
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.DEAD_NEURONS and top.root.layer == "3"


class TupleDictNone(nn.Module):
    """Submodules returning a tuple, a dict and None; the model returns a dict."""

    class Pair(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x * 2, x.detach()

    class Named(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"hidden": torch.relu(self.fc(x)), "mask": x > 0}

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> None:
            return None

    def __init__(self) -> None:
        super().__init__()
        self.pair = self.Pair()
        self.named = self.Named()
        self.probe = self.Probe()
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        doubled, _ = self.pair(x)
        hidden = self.named(doubled)["hidden"]
        self.probe(hidden)
        return {"prediction": self.head(hidden)}


def test_tuple_dict_and_none_outputs_are_handled():
    torch.manual_seed(0)
    model = TupleDictNone()
    dbg, _ = support.train(model, support.regression_batches(), lambda out, y: F.mse_loss(out["prediction"], y))
    assert dbg.steps == 40
    assert {"pair", "named.fc", "head"} <= set(dbg.layers)
    assert dbg.hypotheses() == []


class TiedTwice(nn.Module):
    """One Linear applied twice in one forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.shared = nn.Linear(32, 32)
        self.out = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        h = torch.relu(self.shared(h))
        h = torch.relu(self.shared(h))
        return self.out(h)


def test_a_module_called_several_times_per_forward_is_tracked_per_call():
    torch.manual_seed(0)
    model = TiedTwice()
    dbg, _ = support.train(model, support.regression_batches())
    assert dbg.layers == ["inp", "shared", "out"]
    assert dbg.hypotheses() == []


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU, nn.RNN])
def test_recurrent_layers_are_handled(cell: type[nn.Module]):
    torch.manual_seed(0)
    model = support.LSTMRegressor(cell=cell)
    dbg, _ = support.train(model, support.sequence_batches(), steps=20)
    assert "rnn" in dbg.layers
    assert any(s for s, _ in dbg.history.get("grad_norm", "rnn").points())
    assert dbg.hypotheses() == []


def test_mixed_precision_autocast_is_observed_without_false_alarms():
    torch.manual_seed(0)
    model = support.mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = support.regression_batches()
    with NeuralDbg(model) as dbg:
        for step in range(20):
            x, y = batches(step)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            F.mse_loss(out.float(), y).backward()
            opt.step()
    assert dbg.steps == 20
    assert dbg.hypotheses() == []


# --------------------------------------------------------------------------------------------- steps


def test_two_optimizers_stepping_in_one_iteration_make_one_step():
    torch.manual_seed(0)
    model = support.mlp()
    first = torch.optim.SGD(model[:4].parameters(), lr=0.01)
    second = torch.optim.Adam(model[4:].parameters(), lr=1e-3)
    batches = support.regression_batches()
    with NeuralDbg(model) as dbg:
        for step in range(12):
            x, y = batches(step)
            first.zero_grad()
            second.zero_grad()
            F.mse_loss(model(x), y).backward()
            first.step()
            second.step()
    assert dbg.step_mode == "optimizer"
    assert dbg.steps == 12
    assert dbg.hypotheses() == []


def test_gradient_accumulation_counts_optimizer_steps_not_micro_batches():
    torch.manual_seed(0)
    model = support.mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = support.regression_batches(batch=8)
    with NeuralDbg(model) as dbg:
        for step in range(10):
            opt.zero_grad()
            for micro in range(4):
                x, y = batches(step * 4 + micro)
                (F.mse_loss(model(x), y) / 4).backward()
            opt.step()
    assert dbg.steps == 10
    assert dbg.hypotheses() == []


def test_without_an_optimizer_each_backward_pass_is_a_step():
    torch.manual_seed(0)
    model = support.mlp()
    batches = support.regression_batches()
    with NeuralDbg(model) as dbg:
        for step in range(70):
            x, y = batches(step)
            model.zero_grad()
            F.mse_loss(model(x), y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 1e-3 * p.grad
    assert dbg.step_mode == "backward"
    assert dbg.steps == 70
    assert dbg.hypotheses() == []


def test_manual_steps_take_over_counting():
    torch.manual_seed(0)
    model = support.mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = support.regression_batches()
    with NeuralDbg(model) as dbg:
        for step in range(15):
            x, y = batches(step)
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            dbg.observe_loss(loss)
            dbg.step()
    assert dbg.step_mode == "manual"
    assert dbg.steps == 15
    assert len(dbg.history.get("loss", "").points()) == 15


def test_no_grad_and_eval_forwards_are_not_training_steps():
    torch.manual_seed(0)
    model = support.mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = support.regression_batches()
    poisoned = torch.full((8, 16), float("nan"))
    with NeuralDbg(model) as dbg:
        for step in range(20):
            x, y = batches(step)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            with torch.no_grad():
                model(poisoned)  # validation on garbage must not look like a training fault
            model.eval()
            model(poisoned).sum()  # eval mode with grad enabled: not training either
            model.train()
    assert dbg.steps == 20
    assert dbg.hypotheses() == []


# --------------------------------------------------------------------------------------------- lifecycle


def test_two_debuggers_on_one_model_do_not_interfere():
    torch.manual_seed(0)
    model = support.mlp()
    with torch.no_grad():
        model[2].bias.fill_(-30.0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = support.regression_batches()
    with NeuralDbg(model) as outer:
        for step in range(10):
            if step == 5:
                inner = NeuralDbg(model).attach()
            x, y = batches(step)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        inner.close()
    assert outer.steps == 10 and inner.steps == 5
    assert outer.hypotheses()[0].root.layer == "3"
    assert inner.hypotheses()[0].root.layer == "3"
    assert hook_count(model) == 0


def test_a_model_can_be_watched_again_after_a_run():
    model = support.mlp()
    first, _ = support.train(model, support.regression_batches(), steps=5)
    second, _ = support.train(model, support.regression_batches(), steps=7)
    assert (first.steps, second.steps) == (5, 7)
    assert hook_count(model) == 0


def test_attaching_twice_is_an_error_but_watch_works_as_a_context_manager():
    model = support.mlp()
    dbg = neuraldbg.watch(model)
    with pytest.raises(NeuralDbgError, match="already attached"):
        dbg.attach()
    with dbg:
        model(torch.randn(2, 16)).sum().backward()
    assert not dbg.attached and hook_count(model) == 0


def test_the_model_is_held_weakly():
    model = support.mlp()
    ref = weakref.ref(model)
    dbg, _ = support.train(model, support.regression_batches(), steps=3)
    del model
    gc.collect()
    assert ref() is None
    assert dbg.steps == 3  # the diagnosis outlives the model


def test_bad_options_name_the_value_and_what_was_expected():
    model = support.mlp()
    with pytest.raises(ConfigError, match=r"persistence.*integer.*got 0"):
        NeuralDbg(model, persistence=0)
    with pytest.raises(ConfigError, match=r"unknown option.*'persistance'.*persistence"):
        NeuralDbg(model, persistance=3)
    with pytest.raises(ConfigError, match=r"unknown preset 'fast'.*default, full, economy"):
        NeuralDbg(model, preset="fast")
    with pytest.raises(ConfigError, match=r"torch\.nn\.Module"):
        NeuralDbg("model")  # type: ignore[arg-type]


def test_torch_compile_keeps_the_diagnosis():
    pytest.importorskip("torch._dynamo")
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = support.mlp(width=16, depth=2)
    with torch.no_grad():
        model[2].bias.fill_(-30.0)
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = support.regression_batches()
    counters.clear()
    with NeuralDbg(compiled) as dbg:
        for step in range(8):
            x, y = batches(step)
            opt.zero_grad()
            F.mse_loss(compiled(x), y).backward()
            opt.step()
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.DEAD_NEURONS and top.root.layer == "3"
    assert hook_count(model) == 0


@pytest.mark.parametrize("bad_step", [None, 23])
def test_the_device_path_gives_the_same_diagnosis_as_the_cpu_fast_path(bad_step):
    """On a GPU, cheap steps measure every layer on device and read nothing back until the flush. That path is
    exercised here on CPU tensors (no GPU in CI)."""
    clean = support.regression_batches()

    def batches(step: int) -> support.Batch:
        x, y = clean(step)
        if step == bad_step:
            x = x.clone()
            x[0, 0] = float("nan")
        return x, y

    results = []
    for host_reads in (True, False):
        torch.manual_seed(0)
        model = support.mlp()
        dbg = NeuralDbg(model)
        dbg._recorder.host_reads_are_free = host_reads
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        with dbg:
            for step in range(60):
                x, y = batches(step)
                opt.zero_grad()
                F.mse_loss(model(x), y).backward()
                opt.step()
        results.append([(h.kind, h.root.layer, h.root.step_start) for h in dbg.hypotheses()])
    fast, device = results
    assert fast == device
    assert fast == ([] if bad_step is None else [(FailureKind.NON_FINITE, "", 23)])


def test_a_config_and_a_preset_together_are_refused():
    with pytest.raises(ConfigError, match=r"not both.*preset='full'"):
        NeuralDbg(support.mlp(), neuraldbg.DebugConfig(), preset="full")
