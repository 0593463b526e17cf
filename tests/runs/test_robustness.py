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
from neuraldbg import ConfigError, DebugConfig, FailureKind, NeuralDbg, NeuralDbgError, NeuralDbgWarning


def hook_count(model: nn.Module) -> int:
    """Every hook that could touch the model: its modules' own hooks and the process-wide module and optimizer
    hooks (NeuralDBG registers global ones: nothing is stored on the modules)."""
    from torch.nn.modules import module as module_globals

    own = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())
    shared = (
        module_globals._global_forward_hooks,
        module_globals._global_forward_pre_hooks,
        module_globals._global_backward_hooks,
        module_globals._global_backward_pre_hooks,
        module_globals._global_forward_hooks_with_kwargs,  # torch's handle forgets this one: we remove it
        module_globals._global_forward_hooks_always_called,
    )
    return own + sum(len(d) for d in shared) + optimizer_hook_count()


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
    with NeuralDbg(model):
        assert hook_count(model) > before and optimizer_hook_count() > before_opt  # the count sees our hooks
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
    from neuraldbg.stats import tensors as stats

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
    losses: list[float] = []
    with NeuralDbg(model) as dbg:
        for step in range(70):
            x, y = batches(step)
            model.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            losses.append(float(loss.detach()))
            with torch.no_grad():
                for p in model.parameters():
                    p -= 3e-2 * p.grad
    # plain torch: the run trains (at 1e-3, 70 steps leave the loss at the targets' variance: a run too small to
    # train, which the debugger may rightly report; this test is about counting steps on a healthy run)
    assert sum(losses[-8:]) < 0.1 * sum(losses[:8])
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


@pytest.mark.parametrize("watched", [False, True], ids=["plain", "watched"])
def test_a_closed_debugger_dropped_frees_the_model_by_reference_counting(watched):
    """A smoke test drops its debugger and its model at its end: their memory (a GPU's too) goes then, not at the
    garbage collector's next full pass. The plain twin shows that torch alone frees a trained model so."""
    torch.manual_seed(0)
    model = support.mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    weight = weakref.ref(model[0].weight)
    batches = support.regression_batches()
    _, dbg = support.fit(model, batches, F.mse_loss, steps=70, optimizer=opt, watched=watched)
    if dbg is not None:
        assert dbg.steps == 70 and dbg.explain_failure() == []  # the whole diagnosis ran (and found nothing)
    gc.disable()
    try:
        del model, opt, dbg
        assert weight() is None
    finally:
        gc.enable()


def test_a_debugger_dropped_between_forward_and_backward_leaves_the_backward_pass_alone():
    """Gradient hooks on the layers' outputs stay on the graph when the debugger that put them there is closed and
    dropped before the backward pass: that backward pass runs as without it."""
    torch.manual_seed(0)
    model = support.mlp()
    twin = copy.deepcopy(model)
    x, y = support.regression_batches()(0)
    dbg = NeuralDbg(model, output_gradients=True)
    dbg.attach()
    loss = F.mse_loss(model(x), y)
    recorder = weakref.ref(dbg._recorder)
    dbg.close()
    del dbg
    assert recorder() is None  # freed, while its hooks remain on the graph
    loss.backward()
    F.mse_loss(twin(x), y).backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert p.grad is not None and torch.equal(p.grad, q.grad)


def test_a_debugger_attached_and_dropped_without_close_keeps_observing():
    torch.manual_seed(0)
    model = support.mlp()
    twin = copy.deepcopy(model)
    batches = support.regression_batches()
    dbg = NeuralDbg(model)
    dbg.attach()
    recorder = weakref.ref(dbg._recorder)
    del dbg
    gc.collect()
    kept = recorder()
    assert kept is not None and kept.attached  # held while attached: torch's hook tables hold only its parts
    try:
        watched = support.plain_train(model, batches, steps=20, optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
        plain = support.plain_train(twin, batches, steps=20, optimizer=torch.optim.SGD(twin.parameters(), lr=0.01))
        assert watched == plain
        assert kept.clock.step == 19  # it saw every step: the 20th, counted from 0, is in progress
    finally:
        kept.detach()
    assert hook_count(model) == 0


ENGINE_TYPOS = {
    "a misspelt field": ({"persistance": 3}, "NeuralDbg(): unknown option 'persistance' (did you mean 'persistence'?)"),
    "a shortened field": (
        {"dead_fraction": 0.5},
        "NeuralDbg(): unknown option 'dead_fraction' (did you mean 'dead_unit_fraction'?)",
    ),
    "a misspelt keyword": ({"pluggins": []}, "NeuralDbg(): unknown option 'pluggins' (did you mean 'plugins'?)"),
    "a misspelt preset": ({"preset": "Ful"}, "NeuralDbg(): unknown preset 'Ful' (did you mean 'full'?)"),
    "a key of a config mapping": (
        {"config": {"persistance": 3}},
        "NeuralDbg(): config: unknown option 'persistance' (did you mean 'persistence'?)",
    ),
    "two at once": (
        {"persistance": 3, "dead_fraction": 0.5},
        "NeuralDbg(): unknown options 'persistance' (did you mean 'persistence'?), 'dead_fraction' (did you mean "
        "'dead_unit_fraction'?); expected",
    ),
}


@pytest.mark.parametrize("case", sorted(ENGINE_TYPOS))
def test_a_misspelt_option_or_preset_names_where_it_was_given_and_the_closest_valid_name(case: str):
    options, message = ENGINE_TYPOS[case]
    with pytest.raises(ConfigError) as info:
        NeuralDbg(support.mlp(), **options)
    assert str(info.value).startswith(message), str(info.value)
    assert "; expected " in str(info.value) and "full" in str(info.value)  # what is valid, listed


def test_a_misspelt_option_of_a_config_copy_or_a_callback_names_that_entry_point():
    with pytest.raises(
        ConfigError, match=r"^DebugConfig\.replace\(\): unknown option 'persistance' \(did you mean 'persistence'\?\)"
    ):
        DebugConfig().replace(persistance=3)
    from neuraldbg.integrations.callback import WatchedRun

    with pytest.raises(ConfigError, match=r"^MyCallback\(\): unknown option 'lg' \(did you mean 'log'\?\)"):
        WatchedRun("MyCallback()", None, None, None, (), {"lg": False})


def test_a_name_nothing_resembles_gets_no_suggestion_only_the_valid_names():
    with pytest.raises(ConfigError) as info:
        NeuralDbg(support.mlp(), xyz=1)
    assert "did you mean" not in str(info.value) and "expected config, preset, plugins" in str(info.value)


def test_did_you_mean_compares_case_insensitively_and_falls_back_to_the_one_name_a_prefix_starts():
    from neuraldbg.errors import did_you_mean

    assert did_you_mean("Persistance", ["persistence", "preset"]) == " (did you mean 'persistence'?)"
    assert did_you_mean("dead", ["dead_neurons", "non_finite"]) == " (did you mean 'dead_neurons'?)"
    assert did_you_mean("dens", ["dense_steps", "dense_stride"]) == ""  # a prefix of two: ambiguous
    assert did_you_mean("zz", ["persistence"]) == ""


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


# --------------------------------------------------------------------------------------------- closures


def _closure_run(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> tuple[NeuralDbg, list[float]]:
    """``optimizer.step(closure)``: the forward and backward passes run inside the step; returns the debugger and
    the relative change ||dW||/||W|| of the first layer's weight at each step (plain torch)."""
    batches = support.regression_batches()
    first = next(model.parameters())
    changes = []
    with NeuralDbg(model) as dbg:
        for step in range(steps):
            x, y = batches(step)

            def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                return loss

            before = first.detach().clone()
            opt.step(closure)
            changes.append(float((first.detach() - before).norm() / first.detach().norm()))
    return dbg, changes


def test_closure_steps_are_observed_across_the_real_update():
    torch.manual_seed(0)
    model = support.mlp()
    dbg, changes = _closure_run(model, torch.optim.Adam(model.parameters(), lr=1e-3), steps=30)
    assert min(changes) > 1e-4  # plain torch: the weights move every step
    assert dbg.steps == 30 and dbg.step_mode == "optimizer"
    assert dbg.hypotheses() == []
    ratios = [v for _, v in dbg.history.get("update_ratio", "0").points()]
    assert ratios and min(ratios) > 1e-4  # the updates were measured across the step, not inside the closure


def test_lbfgs_with_several_evaluations_per_step_is_one_step_each_and_healthy():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    dbg, changes = _closure_run(model, opt, steps=12)
    assert min(changes) > 0
    assert dbg.steps == 12 and dbg.hypotheses() == []


def test_a_head_left_out_of_a_closure_optimizer_is_frozen():
    torch.manual_seed(0)
    model = support.mlp()
    head = model[-1]
    opt = torch.optim.Adam([p for layer in list(model)[:-1] for p in layer.parameters()], lr=1e-3)
    before = head.weight.detach().clone()
    dbg, _ = _closure_run(model, opt, steps=20)
    assert torch.equal(before, head.weight)  # plain torch: the head never changed
    (found,) = dbg.hypotheses()
    assert found.kind is FailureKind.FROZEN_PARAMETERS and found.root.layer == str(len(model) - 1)


# --------------------------------------------------------------------------------------------- copies


def test_a_model_can_be_saved_pickled_and_copied_inside_the_block_and_copies_carry_no_hooks():
    import io
    import pickle

    torch.manual_seed(0)
    model = support.mlp()
    with torch.no_grad():
        model[2].bias.fill_(-20.0)  # a dead layer, so the diagnosis has something to keep
    reference = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = support.regression_batches()
    copies = []
    with NeuralDbg(model) as dbg:
        for step in range(20):
            x, y = batches(step)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            buffer = io.BytesIO()
            torch.save(model, buffer)  # word_language_model saves the whole model every epoch
            pickle.loads(pickle.dumps(model))
            teacher = copy.deepcopy(model)  # an EMA / teacher / best-model copy
            teacher_opt = torch.optim.SGD(teacher.parameters(), lr=0.1)
            teacher_opt.zero_grad()
            F.mse_loss(teacher(x), y).backward()  # the copy trains too: it must not be recorded
            teacher_opt.step()
            copies.append(teacher)
    assert all(hook_count(c) == 0 for c in copies)
    assert hook_count(model) == 0
    assert dbg.steps == 20
    expected, _ = support.train(reference, batches, steps=20)
    assert [(h.kind, h.root.layer, h.root.step_start) for h in dbg.hypotheses()] == [
        (h.kind, h.root.layer, h.root.step_start) for h in expected.hypotheses()
    ]


def test_state_dict_is_unchanged_by_the_debugger():
    plain = _adam_dropout_run(watch=False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(inplace=True), nn.Dropout(0.3), nn.Linear(64, 1))
    with NeuralDbg(model):
        state = model.state_dict()
    assert list(state) == list(plain)
    assert all(type(v) is torch.Tensor for v in state.values())


# --------------------------------------------------------------------------------------------- threads


def test_an_inference_thread_on_the_watched_model_does_not_change_the_diagnosis():
    import threading

    def run(with_thread: bool) -> tuple[list[tuple[FailureKind, str, int]], int]:
        torch.manual_seed(0)
        model = support.mlp()
        with torch.no_grad():
            model[2].bias.fill_(-20.0)  # '3' (ReLU) dead from step 0
        stop = threading.Event()

        def serve() -> None:
            while not stop.is_set():
                with torch.no_grad():
                    model(torch.randn(64, 16) * 5)  # predictions served while the model trains

        thread = threading.Thread(target=serve, daemon=True)
        dbg = NeuralDbg(model, preset="full")
        with dbg:
            if with_thread:
                thread.start()
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            batches = support.regression_batches()
            for step in range(40):
                x, y = batches(step)
                opt.zero_grad()
                F.mse_loss(model(x), y).backward()
                opt.step()
            stop.set()
        if with_thread:
            thread.join()
        found = [(h.kind, h.root.layer, h.root.step_start) for h in dbg.hypotheses()]
        return found, dbg._recorder.coverage.no_grad_forwards + dbg._recorder.coverage.other_thread_forwards

    alone, _ = run(with_thread=False)
    served, ignored = run(with_thread=True)
    assert ignored > 0  # the other thread really ran forwards while the model trained
    assert served == alone and alone[0][:2] == (FailureKind.DEAD_NEURONS, "3")


# --------------------------------------------------------------------------------------------- tensor kinds


def test_sparse_embedding_gradients_are_observed_and_a_dead_layer_beside_them_is_found():
    class SparseBag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(50, 16, sparse=True)
            self.fc = nn.Linear(16, 32)
            self.act = nn.ReLU()
            self.out = nn.Linear(32, 1)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.out(self.act(self.fc(self.emb(tokens).mean(1))))

    torch.manual_seed(0)
    model = SparseBag()
    with torch.no_grad():
        model.fc.bias.fill_(-20.0)
    sparse_opt = torch.optim.SparseAdam(list(model.emb.parameters()), lr=1e-2)
    dense_opt = torch.optim.Adam([*model.fc.parameters(), *model.out.parameters()], lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with NeuralDbg(model, preset="full") as dbg:  # NeuralDbgWarning is an error in this suite
        for _ in range(20):
            tokens, y = torch.randint(0, 50, (32, 5), generator=g), torch.randn(32, 1, generator=g)
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            F.mse_loss(model(tokens), y).backward()
            assert model.emb.weight.grad.is_sparse
            sparse_opt.step()
            dense_opt.step()
    assert [(h.kind, h.root.layer) for h in dbg.hypotheses()] == [(FailureKind.DEAD_NEURONS, "act")]
    assert dbg.history.get("grad_norm", "emb") is not None  # the sparse gradient was read, not skipped


def test_complex_parameters_are_observed():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8, dtype=torch.cfloat), nn.Linear(8, 1, dtype=torch.cfloat))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(16, 8, dtype=torch.cfloat)
    y = torch.randn(16, 1, dtype=torch.cfloat)
    with NeuralDbg(model) as dbg:
        for _ in range(20):
            opt.zero_grad()
            (model(x) - y).abs().pow(2).mean().backward()
            opt.step()
    assert dbg.steps == 20 and dbg.hypotheses() == []
    grad = dict(dbg.history.get("grad_norm", "0").points())[0]
    assert grad > 0


def test_a_complex_branch_used_on_alternate_steps_leaves_the_users_run_without_warnings(recwarn):
    """Its gradient is exactly zero on the steps that skip it (zeroed in place): the zero is confirmed by each
    gradient's largest magnitude, which reads a complex gradient whole (cast to real, it warned and lost its
    imaginary part)."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.spec = nn.Linear(8, 4, dtype=torch.cfloat)
            self.body = nn.Linear(8, 16)
            self.head = nn.Linear(16 + 8, 2)

        def forward(self, x: torch.Tensor, spectral: bool) -> torch.Tensor:
            h = torch.relu(self.body(x))
            if spectral:
                z = self.spec(x.to(torch.cfloat))
                f = torch.cat([z.real, z.imag], 1)
            else:
                f = torch.zeros(x.shape[0], 8)
            return self.head(torch.cat([h, f], 1))

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
    with NeuralDbg(model) as dbg:
        for i in range(12):
            opt.zero_grad(set_to_none=False)
            F.cross_entropy(model(x, spectral=i % 2 == 0), y).backward()
            if i % 2:  # ground truth: the branch got an exactly zero gradient on this step
                assert not model.spec.weight.grad.any()
            opt.step()
    assert dbg.steps == 12
    assert [str(w.message) for w in recwarn.list] == []


def test_lazy_modules_materialised_in_the_first_forward_are_observed():
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.Linear(32, 1))
    dbg, losses = support.train(model, support.regression_batches(), steps=60)
    assert sum(losses[-10:]) < sum(losses[:10])
    assert dbg.steps == 60 and dbg.hypotheses() == []


# ----------------------------------------------------------------------------------- statistics mean one thing


def test_a_relu_output_without_a_batch_dimension_counts_its_elements_as_units():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Flatten(0), nn.ReLU())  # a 1-D ReLU output
    with torch.no_grad():
        model[0].bias.fill_(-20.0)
    x = torch.randn(5, 4)
    dbg, _ = support.train(model, lambda s: (x, torch.ones(40)), steps=10)
    (found,) = dbg.hypotheses()
    assert found.kind is FailureKind.DEAD_NEURONS
    assert found.root.metrics["units"] == 40 and found.root.metrics["dead_fraction"] == 1.0


def test_the_gradient_norm_history_is_what_the_optimizer_received_at_every_step():
    torch.manual_seed(0)
    model = support.mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = support.regression_batches()
    received = []
    with NeuralDbg(model, preset="full") as dbg:
        for step in range(20):
            x, y = batches(step)
            opt.zero_grad()
            (1e4 * F.mse_loss(model(x), y)).backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # clipped from the very first step
            received.append(
                float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model[0].parameters()])))
            )
            opt.step()
    history = dict(dbg.history.get("grad_norm", "0").points())
    assert set(history) == set(range(20))
    for step, value in history.items():
        assert value == pytest.approx(received[step], rel=1e-4), step  # after clipping, step 0 included


def test_explanations_meant_for_print_show_a_layer_names_escapes_visibly():
    """``for text in dbg.explain_failure(): print(text)`` (the README's loop) never sends a name's terminal escape
    or bidirectional override to the terminal; ``hypotheses()`` keeps the explanation as written."""
    torch.manual_seed(0)
    hostile = "\x1b[2K\rFAKE: healthy \u202e"
    model = nn.Sequential()
    model.add_module("a", nn.Linear(16, 32))
    model.add_module(hostile, nn.Linear(32, 32))
    model.add_module("act", nn.ReLU())
    model.add_module("out", nn.Linear(32, 1))
    with torch.no_grad():
        model[1].bias.fill_(-20.0)  # ground truth below: the ReLU after it never fires
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model) as dbg:
        for _ in range(40):
            x = torch.randn(64, 16)
            opt.zero_grad()
            F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
            opt.step()
    assert model[2](model[1](model[0](torch.randn(64, 16)))).max() == 0.0
    texts = dbg.explain_failure()
    assert texts and not any(c in t for t in texts for c in ("\x1b", "\r", "\u202e"))
    assert "'\\x1b[2K\\x0dFAKE: healthy \\u202e'" in texts[0]
    assert hostile in dbg.hypotheses()[0].explanation
