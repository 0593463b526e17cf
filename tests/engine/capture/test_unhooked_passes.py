"""Cheap CPU steps run the model without the global module hook (torch then calls every layer on its fast path):
the model's own call opens the pass, the layers' outputs are still kept, and the hook is back outside that call.

Whether the hook is in torch's table is read from inside the model's forward (a probe layer), in plain torch terms:
``torch.nn.modules.module._global_forward_hooks``. Runs in a process where torch.compile compiled something keep the
hook on every pass (see test_after_torch_compile_ran_every_pass_keeps_the_module_hook), so the tests that expect
unhooked passes say that nothing was compiled, whatever ran before them in this process.
"""

from __future__ import annotations

import copy
import io
import pickle
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_globals

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.capture import hooks

#: torch's own ``nn.Module.__call__``, as it is when no debugger is attached
MODULE_CALL = nn.Module._wrapped_call_impl


class Probe(nn.Module):
    """Passes its input through and notes, per call, whether any global module hook is in torch's table."""

    def __init__(self) -> None:
        super().__init__()
        self.hooked: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.hooked.append(bool(module_globals._global_forward_hooks))
        return x


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


@pytest.fixture
def nothing_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "compiled_any", lambda: False)


def _train(model: nn.Module, steps: int, between: list[bool] | None = None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)
        opt.zero_grad()
        out = model(x)
        if between is not None:  # outside the model's call, between its forward and its loss
            between.append(bool(module_globals._global_forward_hooks))
        F.mse_loss(out, y).backward()
        opt.step()


def test_a_cheap_cpu_pass_runs_without_the_module_hook_and_a_full_pass_with_it(nothing_compiled):
    torch.manual_seed(0)
    probe = Probe()
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), probe, nn.Linear(8, 1))
    assert not module_globals._global_forward_hooks  # no other hook in this process: what the probe sees is ours
    between: list[bool] = []
    with NeuralDbg(model) as dbg:
        _train(model, 40, between)
    hooked = probe.hooked
    assert dbg.steps == 40 and len(hooked) == 40
    assert all(hooked[:17])  # the first 16 steps are fully observed: every layer seen by the hook
    assert hooked[32]  # ... and every 16th after
    assert not any(hooked[17:32]) and not any(hooked[33:40])  # cheap steps: torch's fast path for every layer
    assert all(between)  # the hook is back as soon as the model's call returns
    assert not module_globals._global_forward_hooks  # and gone after the block
    assert nn.Module.__dict__["__call__"] is MODULE_CALL  # unwrapped


def test_a_pass_on_another_thread_or_without_gradients_keeps_the_hook(nothing_compiled):
    torch.manual_seed(0)
    probe = Probe()
    model = nn.Sequential(nn.Linear(6, 8), probe, nn.Linear(8, 1))
    with NeuralDbg(model):
        _train(model, 20)
        with torch.no_grad():  # a validation pass: not a training step, the hook decides as before
            model(torch.randn(4, 6))
    assert probe.hooked[17] is False and probe.hooked[-1] is True


def test_a_non_finite_value_begun_on_an_unhooked_pass_is_traced_to_its_layer(nothing_compiled):
    def build() -> nn.Sequential:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 16), Log(), Probe(), nn.Linear(16, 1))
        with torch.no_grad():
            model[2].bias.fill_(5.0)  # log's input positive on ordinary batches
        return model

    def batches():
        g = torch.Generator().manual_seed(3)
        for i in range(120):
            x, y = torch.randn(32, 10, generator=g), torch.randn(32, 1, generator=g)
            yield i, (x * 1e4 if i == 100 else x), y  # one batch of raw, unscaled values at step 100

    # ground truth, plain torch: at step 100 log is given finite values and returns non-finite ones
    plain = build()
    opt = torch.optim.SGD(plain.parameters(), lr=1e-3)
    for i, x, y in batches():
        opt.zero_grad()
        h = plain[2](plain[1](plain[0](x)))
        if i == 100:
            assert torch.isfinite(h).all() and not torch.isfinite(torch.log(h)).all()
            break
        assert torch.isfinite(torch.log(h)).all()
        F.mse_loss(plain(x), y).backward()
        opt.step()

    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with NeuralDbg(model) as dbg:
        for _, x, y in batches():
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    assert model[4].hooked[100] is False  # the step was a cheap, unhooked one
    first = next(e for e in dbg.events if e.kind is FailureKind.NON_FINITE)
    assert (first.layer, first.step_start) == ("3", 100)
    assert "'3' (Log) produced non-finite values" in dbg.explain_failure()[0]


def test_a_model_raising_in_an_unhooked_pass_gets_the_module_hook_back(nothing_compiled):
    class Flaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            if self.calls == 20:
                raise RuntimeError("a bad batch")
            return x

    torch.manual_seed(0)
    flaky, probe = Flaky(), Probe()
    model = nn.Sequential(nn.Linear(6, 8), flaky, probe, nn.Linear(8, 1))
    with NeuralDbg(model) as dbg:
        _train(model, 19)
        with pytest.raises(RuntimeError, match="a bad batch"):
            model(torch.randn(4, 6))
        assert module_globals._global_forward_hooks  # back in torch's table
        _train(model, 10)
    assert dbg.steps == 29
    assert probe.hooked[-1] is False  # cheap steps after it still run unhooked


def test_a_model_watched_and_copied_mid_run_pickles_and_other_instances_are_untouched(nothing_compiled):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    other = nn.Linear(6, 3)
    x = torch.randn(5, 6)
    expected = other(x)
    with NeuralDbg(model) as dbg:
        _train(model, 20)  # step 20: a cheap step
        twin = copy.deepcopy(model)
        saved = io.BytesIO()
        torch.save(model, saved)
        restored = pickle.loads(pickle.dumps(model))
        assert torch.equal(other(x), expected)
        seen = dbg._recorder.forward._seen
        model(torch.randn(2, 6))  # a cheap pass: its layers' outputs are kept until the pass is let go ...
        other(x)
        assert all(name in {"0", "1", "2"} for name, _ in seen)  # ... and no other module's
    for copied in (twin, restored):
        assert torch.equal(copied(x), model(x))
        assert not copied._forward_hooks and not copied[0]._forward_hooks
    assert nn.Module.__dict__["__call__"] is MODULE_CALL


def test_a_module_call_wrapped_by_someone_else_after_the_debugger_keeps_working(nothing_compiled):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    calls: list[int] = []

    def theirs(self, *args, **kwargs):
        calls.append(1)
        return ours(self, *args, **kwargs)

    try:
        with NeuralDbg(model) as dbg:
            ours = nn.Module.__call__
            nn.Module.__call__ = theirs
            _train(model, 20)
        assert dbg.steps == 20 and len(calls) == 20 * 4  # the model and its three layers, each step
        assert nn.Module.__call__ is theirs  # left in place: ours, under it, passes every call through
        x = torch.ones(1, 6)
        assert torch.equal(model(x), model[2](model[1](model[0](x))))
    finally:
        nn.Module.__call__ = MODULE_CALL


def test_a_module_call_wrapped_by_someone_else_before_the_debugger_is_still_called(nothing_compiled):
    # the debugger takes torch's own __call__ step itself: only that one, never a wrapper that was there first
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    calls: list[type] = []

    def theirs(self, *args, **kwargs):
        calls.append(type(self))
        return MODULE_CALL(self, *args, **kwargs)

    nn.Module.__call__ = theirs
    try:
        with NeuralDbg(model) as dbg:
            assert nn.Module.__call__ is not theirs  # wrapped by the debugger, over theirs
            _train(model, 20)
        assert nn.Module.__call__ is theirs  # theirs again after
    finally:
        nn.Module.__call__ = MODULE_CALL
    assert dbg.steps == 20
    assert calls == [nn.Sequential, nn.Linear, nn.ReLU, nn.Linear] * 20  # every call of every step, cheap or full


def test_a_layer_compiled_by_module_compile_keeps_its_compiled_call_under_the_debugger(nothing_compiled):
    # module.compile() puts the compiled call in _compiled_call_impl, which torch's __call__ prefers: so does ours
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    layer = model[2]
    through: list[int] = []

    def compiled(*args, **kwargs):
        through.append(1)
        return layer._call_impl(*args, **kwargs)

    layer._compiled_call_impl = compiled
    x = torch.randn(4, 6)
    with NeuralDbg(model) as dbg:
        _train(model, 20)
        out = model(x)
    assert dbg.steps == 20
    assert len(through) == 21  # each step's call of the layer, and the one after
    assert torch.equal(out, layer(model[1](model[0](x))))


def test_a_torch_whose_module_call_does_more_is_called_through(nothing_compiled, monkeypatch: pytest.MonkeyPatch):
    # the wrapper takes torch's __call__ step itself only while that step is all torch's __call__ does
    assert hooks._steppable is MODULE_CALL  # this torch: the compiled call or _call_impl, nothing else
    through: list[int] = []

    def more(self, *args, **kwargs):  # a later torch's __call__, doing something of its own first
        through.append(1)
        return MODULE_CALL(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "__call__", more)
    monkeypatch.setattr(hooks, "_torch_call", more)
    monkeypatch.setattr(hooks, "_steppable", None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    with NeuralDbg(model) as dbg:
        _train(model, 20)
    assert dbg.steps == 20 and len(through) == 20 * 4  # every module call went through it
    assert nn.Module.__call__ is more


def test_after_torch_compile_ran_every_pass_keeps_the_module_hook(monkeypatch: pytest.MonkeyPatch):
    compiled = torch.compile(lambda t: t * 2 + 1, backend="eager")
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))
    assert hooks.compiled_any()  # read from torch.compile's own bookkeeping
    torch.manual_seed(0)
    probe = Probe()
    model = nn.Sequential(nn.Linear(6, 8), probe, nn.Linear(8, 1))
    with NeuralDbg(model):
        _train(model, 30)
    assert all(probe.hooked)  # a graph compiled while the hook is out would never call it: it stays in


def test_the_device_path_runs_unhooked_too_and_still_measures_every_layer_on_a_cheap_step(nothing_compiled):
    torch.manual_seed(0)
    probe = Probe()
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), probe, nn.Linear(8, 1))
    dbg = NeuralDbg(model)
    dbg._recorder.host_reads_are_free = False  # a GPU's path: every layer output's norm on every step
    records = []
    sink = dbg._recorder._sink
    dbg._recorder._sink = lambda found: (records.extend(found), sink(found))[1]
    with dbg:
        _train(model, 20)
    cheap = [r for r in records if not r.full]
    assert cheap and probe.hooked[17] is False
    for record in cheap:  # the layer outputs kept on an unhooked pass are measured as the hook's were
        assert {key[0] for key in record.act} >= {"0", "1", "2", "3"}


def test_a_pass_whose_loss_graph_is_checked_sees_every_layer(nothing_compiled):
    torch.manual_seed(0)
    probe = Probe()
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), probe, nn.Linear(8, 1))
    with NeuralDbg(model) as dbg:
        _train(model, 20)  # cheap steps by now
        fwd = dbg._recorder.forward
        fwd.nodes = {}  # a check of the loss's graph wants the graph nodes of the layers' outputs named
        model(torch.randn(4, 6))
        named = set(fwd.nodes.values())
    assert probe.hooked[-1] is True and probe.hooked[-2] is False
    assert named >= {"0", "1", "3"}  # "2" passes its input through: its output's node is the ReLU's


def test_a_layer_whose_class_changes_during_the_run_is_still_traced(nothing_compiled):
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(16), nn.ReLU(), nn.Linear(16, 1), Probe())
    opt = None
    g = torch.Generator().manual_seed(2)
    with NeuralDbg(model) as dbg:
        for step in range(110):
            x, y = torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)
            if step == 20:  # a parametrisation gives layer '4' a class of its own
                nn.utils.parametrizations.weight_norm(model[4])
                opt = torch.optim.SGD(model.parameters(), lr=1e-2)
            if step == 100:
                with torch.no_grad():
                    model[2].weight[0, 0] = float("nan")  # a corrupted weight in the second (once lazy) layer
                    assert torch.isfinite(model[1](model[0](x))).all()  # its input: finite (plain torch)
            out = model(x)  # the first call makes the lazy layers Linear layers
            opt = opt or torch.optim.SGD(model.parameters(), lr=1e-2)
            opt.zero_grad()
            F.mse_loss(out, y).backward()
            opt.step()
    assert type(model[2]) is nn.Linear and type(model[4]).__name__ == "ParametrizedLinear"
    assert model[5].hooked[100] is False  # a cheap, unhooked pass
    first = next(e for e in dbg.events if e.kind is FailureKind.NON_FINITE)
    assert (first.layer, first.step_start) == ("2", 100)


def test_a_model_or_layer_with_forward_hooks_of_its_own_keeps_the_module_hook(nothing_compiled):
    for hooked in ("model", "layer"):
        torch.manual_seed(0)
        probe = Probe()
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), probe, nn.Linear(8, 1))
        with NeuralDbg(model):
            _train(model, 18)
            # the module hook sees an output before the module's own hooks change it (a nan_to_num guard)
            target = model if hooked == "model" else model[0]
            handle = target.register_forward_hook(lambda m, i, o: torch.nan_to_num(o))
            _train(model, 20)  # from the next fully observed step on, every pass keeps the module hook
            handle.remove()
        assert probe.hooked[17] is False and all(probe.hooked[33:]), hooked
        if hooked == "model":  # the model's own hooks are looked at on each of its calls: from the very next one
            assert all(probe.hooked[18:])


def test_the_hook_is_put_back_where_it_was_among_others_with_its_keyword_flag_kept(nothing_compiled):
    torch.manual_seed(0)
    probe = Probe()
    model = nn.Sequential(nn.Linear(6, 8), probe, nn.Linear(8, 1))
    seen: list[list[int]] = []
    with NeuralDbg(model):
        others = nn.modules.module.register_module_forward_hook(lambda m, i, o: None)  # another monitor's hook
        order = list(module_globals._global_forward_hooks)
        flags = dict(module_globals._global_forward_hooks_with_kwargs)
        probe.forward = lambda x: (seen.append(list(module_globals._global_forward_hooks_with_kwargs)), x)[1]
        _train(model, 20)
        assert list(module_globals._global_forward_hooks) == order  # ours first, theirs after, as registered
        others.remove()
    ours = next(k for k, v in flags.items() if v)
    assert all(ours in keys for keys in seen)  # also while ours is out: a thread that took it calls it right


def test_layers_run_without_gradients_inside_the_forward_are_not_kept(nothing_compiled):
    class Frozen(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
            self.head = nn.Linear(8, 1)
            self.kept: list[str] = []
            self.seen: list[tuple[str, object]] | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():  # a frozen backbone, as the module hook never saw it
                h = self.backbone(x)
            out = self.head(h)
            if self.seen is not None:
                self.kept = [name for name, _ in self.seen]
            return out

    torch.manual_seed(0)
    model = Frozen()
    with NeuralDbg(model) as dbg:
        _train(model, 20)
        model.seen = dbg._recorder.forward._seen
        _train(model, 1)  # step 20: cheap
    assert model.kept == ["head"]


def test_a_model_called_inside_its_own_call_keeps_the_module_hook_after(nothing_compiled):
    class Chunked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
            self.probe = Probe()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] > 8:  # a large batch: itself on each half
                return torch.cat([self(half) for half in x.split(x.shape[0] // 2)])
            return self.net(self.probe(x))

    torch.manual_seed(0)
    model = Chunked()
    with NeuralDbg(model) as dbg:
        _train(model, 30)
    assert dbg.steps == 30 and all(model.probe.hooked)  # each inner call a pass of its own, as before


def test_torch_fx_traces_a_watched_model_as_it_traces_it_unwatched(nothing_compiled):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    plain = [(n.op, n.target) for n in torch.fx.symbolic_trace(model).graph.nodes]
    assert [op for op, _ in plain].count("call_module") == 3  # its layers are leaves
    with NeuralDbg(model):
        _train(model, 20)
        assert [(n.op, n.target) for n in torch.fx.symbolic_trace(model).graph.nodes] == plain
        _train(model, 5)


def test_a_layer_called_from_another_thread_during_an_unhooked_pass_is_not_kept(nothing_compiled):
    class Server(nn.Module):
        """Passes its input through; on one call, has another thread run the first layer (a prediction served)."""

        def __init__(self) -> None:
            super().__init__()
            self.serve: nn.Module | None = None
            self.served: list[torch.Tensor] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.serve is not None:
                layer, self.serve = self.serve, None
                worker = threading.Thread(target=lambda: self.served.append(layer(torch.randn(3, 6))))
                worker.start()
                worker.join()
            return x

    class Snapshot(nn.Module):
        """Passes its input through, noting what the debugger keeps of the pass so far."""

        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, object]] | None = None
            self.kept: list[tuple[str, object]] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.seen is not None:
                self.kept = list(self.seen)
            return x

    torch.manual_seed(0)
    server, snapshot = Server(), Snapshot()
    model = nn.Sequential(nn.Linear(6, 8), server, nn.Linear(8, 1), snapshot)
    with NeuralDbg(model) as dbg:
        _train(model, 20)
        snapshot.seen = dbg._recorder.forward._seen
        server.serve = model[0]
        out = model(torch.randn(4, 6))  # a cheap, unhooked pass
        F.mse_loss(out, torch.zeros(4, 1)).backward()
    assert len(server.served) == 1
    assert [name for name, _ in snapshot.kept] == ["0", "1", "2"]  # the training thread's calls only, in order
    assert all(output is not server.served[0] for _, output in snapshot.kept)
