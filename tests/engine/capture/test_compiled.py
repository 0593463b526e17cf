"""torch.compile: the debugger adds no graph break and no recompilation, and still diagnoses a broken model.

Both ways users wire it are covered: the debugger on the compiled module (``NeuralDbg(torch.compile(model))``)
and on the original module while the compiled one trains (``dbg = NeuralDbg(model); torch.compile(model)``).
Dynamo's own counters are read after a warm-up and compared with the same model compiled without a debugger.

Graph breaks, recompilations and what Dynamo caches are decided by Dynamo before any backend sees a graph, so the
tests about them compile with the ``aot_eager`` backend (Dynamo and AOTAutograd, as torch.compile runs them, with
the graph run by eager kernels): inductor's C++ code generation costs tens of seconds per model on a cold cache and
changes none of those counts. Inductor, torch.compile's default, compiles where its generated code is what is
checked: the statistics the compiled hooks compute, compared with eager ones (what every diagnosis here reads).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.utils import counters  # noqa: E402

WARMUP = 6
STEPS = 16
DYNAMO = "aot_eager"  # the backend of the tests about Dynamo's graphs, breaks and guards (see the module docstring)


class Block(nn.Module):
    """A transformer encoder block with a head: a model class of the user's (torch.compile runs the hooks of such
    a root module outside its graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(1))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 1),
    )


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "mlp": (mlp, (8, 16)),
    "cnn": (cnn, (4, 3, 8, 8)),
    "transformer block": (Block, (4, 5, 16)),
}


def compiled_run(
    name: str, wrap: str | None, *, dead: bool = False, bad_step: int | None = None
) -> tuple[NeuralDbg | None, dict[str, int], dict[str, int]]:
    """Train a compiled model; returns the debugger and Dynamo's counts after the warm-up and at the end."""
    build, shape = MODELS[name]
    dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = build()
    if dead:
        with torch.no_grad():
            model[0].bias.fill_(-30.0)  # the ReLU after it is dead from step 0
    compiled = torch.compile(model, backend=DYNAMO)
    dbg = None if wrap is None else NeuralDbg(compiled if wrap == "compiled" else model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    warm: dict[str, int] = {}
    if dbg is not None:
        dbg.attach()
    try:
        for step in range(STEPS):
            x, y = torch.randn(*shape, generator=g), torch.randn(shape[0], 1, generator=g)
            if step == bad_step:
                x[0].fill_(float("nan"))
            opt.zero_grad()
            F.mse_loss(compiled(x), y).backward()
            opt.step()
            if step == WARMUP - 1:
                warm = counts()
    finally:
        if dbg is not None:
            dbg.close()
    return dbg, warm, counts()


def counts() -> dict[str, int]:
    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "graphs": counters["stats"]["unique_graphs"],
        "frames": counters["stats"]["calls_captured"] and counters["frames"]["total"],
    }


@pytest.mark.parametrize("wrap", ["compiled", "original"])
@pytest.mark.parametrize("name", list(MODELS))
def test_the_debugger_adds_no_graph_break_and_no_recompilation(name: str, wrap: str):
    _, plain_warm, plain_end = compiled_run(name, None)
    dbg, warm, end = compiled_run(name, wrap)
    assert end["graph_breaks"] == plain_end["graph_breaks"] == 0
    assert end["graphs"] == plain_end["graphs"]  # no extra graph, no recompilation at all
    assert end["frames"] - warm["frames"] == plain_end["frames"] - plain_warm["frames"]  # steady state: as plain
    assert dbg is not None and dbg.steps == STEPS and dbg.hypotheses() == []


@pytest.mark.parametrize("wrap", ["compiled", "original"])
def test_explain_sees_one_graph_with_the_debugger_attached(wrap: str):
    dynamo.reset()
    torch.manual_seed(0)
    model = Block()
    dbg = NeuralDbg(torch.compile(model) if wrap == "compiled" else model)
    with dbg:
        found = dynamo.explain(model)(torch.randn(4, 5, 16))
    assert (found.graph_count, found.graph_break_count) == (1, 0)


@pytest.mark.parametrize("wrap", ["compiled", "original"])
def test_a_dead_layer_in_a_compiled_model_is_diagnosed_at_its_layer(wrap: str):
    dbg, _, end = compiled_run("mlp", wrap, dead=True)
    assert end["graph_breaks"] == 0
    assert dbg is not None
    top = dbg.hypotheses()[0]
    assert (top.kind, top.root.layer, top.root.step_start) == (FailureKind.DEAD_NEURONS, "1", 0)


@pytest.mark.parametrize("wrap", ["compiled", "original"])
def test_a_nan_batch_in_a_compiled_model_is_a_data_problem_at_its_step(wrap: str):
    dbg, _, _ = compiled_run("mlp", wrap, bad_step=9)
    assert dbg is not None
    top = dbg.hypotheses()[0]
    assert (top.kind, top.root.event_type.value, top.root.step_start) == (FailureKind.NON_FINITE, "input", 9)


def test_the_compiled_statistics_match_the_eager_ones():
    """The same dead model, compiled and not: the same per-layer statistics at the same steps."""
    found = {}
    for compile_it in (False, True):
        dynamo.reset()
        torch.manual_seed(0)
        model = support.mlp(width=16, depth=2)
        with torch.no_grad():
            model[2].bias.fill_(-30.0)
        run = torch.compile(model) if compile_it else model
        dbg = NeuralDbg(model, preset="full")
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        batches = support.regression_batches()
        with dbg:
            for step in range(8):
                x, y = batches(step)
                opt.zero_grad()
                F.mse_loss(run(x), y).backward()
                opt.step()
        found[compile_it] = {
            metric: dbg.history.get(metric, layer).points()
            for metric, layer in (("dead_fraction", "3"), ("output_rms", "2"), ("grad_norm", "0"))
        }
    for metric, points in found[False].items():
        assert [s for s, _ in points] == [s for s, _ in found[True][metric]]
        for (_, eager), (_, compiled) in zip(points, found[True][metric]):
            assert compiled == pytest.approx(eager, rel=1e-4, abs=1e-7), metric


@pytest.mark.parametrize("wrap", ["compiled", "original"])
def test_attaching_the_same_debugger_again_recompiles_nothing(wrap: str):
    """attach() after close() continues the run; each attachment used to give the global hook a new key in
    torch's table, which Dynamo guards on: one recompilation per attach, eager after the limit."""
    dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    compiled = torch.compile(model, backend=DYNAMO)
    dbg = NeuralDbg(compiled if wrap == "compiled" else model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    graphs = []
    for _ in range(10):  # more attachments than Dynamo's recompile limit (8)
        with dbg:
            for _ in range(3):
                opt.zero_grad()
                F.mse_loss(compiled(torch.randn(8, 16, generator=g)), torch.randn(8, 1, generator=g)).backward()
                opt.step()
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs == [1] * 10 and sum(counters["graph_break"].values()) == 0
    assert dbg.steps == 30 and not dbg.attached


def _train_compiled(compiled: Callable[..., torch.Tensor], model: nn.Module, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(compiled(torch.randn(8, 16, generator=g)), torch.randn(8, 1, generator=g)).backward()
        opt.step()


def _small() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


@pytest.mark.filterwarnings("ignore:Using `torch.compile\\(module\\)` when there are global hooks")
@pytest.mark.parametrize("wrap", ["compiled", "original"])
def test_a_model_compiled_before_the_debugger_attached_is_still_observed(wrap: str):
    """Dynamo does not guard on the global hook table being empty: a graph compiled before the debugger attached
    (here: a twin trained first, as an earlier test of the same process would) never calls its hook."""
    dynamo.reset()
    twin = _small()
    _train_compiled(torch.compile(twin, backend=DYNAMO), twin, 3)
    calls = []  # plain torch: a global hook registered now is not called by the layers of that graph
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: calls.append(type(m).__name__))
    try:
        _train_compiled(torch.compile(twin, backend=DYNAMO), twin, 1)
    finally:
        handle.remove()
    assert "Linear" not in calls
    torch.manual_seed(0)
    model = _small()
    with torch.no_grad():
        model[0].bias.fill_(-30.0)
    compiled = torch.compile(model, backend=DYNAMO)
    with NeuralDbg(compiled if wrap == "compiled" else model) as dbg:
        _train_compiled(compiled, model, 20)
    assert dbg.steps == 20
    top = dbg.hypotheses()[0]
    assert (top.kind, top.root.layer, top.root.step_start) == (FailureKind.DEAD_NEURONS, "1", 0)


def test_steps_run_without_the_debugger_between_two_attachments_do_not_blind_it():
    dynamo.reset()
    torch.manual_seed(0)
    model = _small()
    compiled = torch.compile(model, backend=DYNAMO)
    dbg = NeuralDbg(compiled)
    with dbg:
        _train_compiled(compiled, model, 3)
    _train_compiled(compiled, model, 3)  # detached: Dynamo compiles a graph without the hook
    with torch.no_grad():
        model[0].bias.fill_(-30.0)
    with dbg:
        _train_compiled(compiled, model, 12)
    assert dbg.steps == 15
    assert [(h.kind, h.root.layer) for h in dbg.hypotheses()][:1] == [(FailureKind.DEAD_NEURONS, "1")]


def test_two_debuggers_and_a_plain_copy_taking_turns_in_any_order_each_observe_every_step():
    """Compiled copies of one model class share their graphs (Dynamo keys them by code): while one debugger is
    detached, another's phase or a plain copy's may replace them one for one, the graphs it knew gone and as many
    new ones in their place, some without its hook. Counting graphs did not see that, and a debugger missed 8 of
    its 30 steps; graphs are now told apart by their compile ids."""
    dynamo.reset()
    copies = []
    for wrap in ("plain", "compiled", "original"):
        torch.manual_seed(0)
        model = _small()
        compiled = torch.compile(model, backend=DYNAMO)
        dbg = None if wrap == "plain" else NeuralDbg(compiled if wrap == "compiled" else model)
        copies.append((compiled, model, dbg))
    for repeat in range(6):
        for compiled, model, dbg in copies[repeat % 3 :] + copies[: repeat % 3]:
            if dbg is None:
                _train_compiled(compiled, model, 5)
                continue
            with dbg:
                _train_compiled(compiled, model, 5)
    assert [dbg.steps for _, _, dbg in copies if dbg is not None] == [30, 30]
