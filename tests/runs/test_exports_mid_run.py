"""Exporting the watched model inside the block (``torch.jit.trace``, ``torch.export.export``: a checkpoint written
at the end of an epoch) records the model's operations alone, and the run goes on being observed. Before, the
debugger's forward hooks ran while the tracer recorded: ``jit.trace`` failed its own check (the graphs of two
invocations differed) and ``torch.export`` baked the debugger's norms into the exported program, then observation
stopped at the next step on a symbolic value left behind ("observation incomplete" on a healthy run). Ground truth:
the same export of an identical model trained without the debugger."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 16, generator=g)
    return x, (x @ torch.randn(16, 4, generator=g)).argmax(1)


def _train(model: nn.Module, opt: torch.optim.Optimizer, start: int, steps: int) -> list[float]:
    x, y = _data()
    losses = []
    for i in range(start, start + steps):
        j = (i * 32) % 512
        opt.zero_grad()
        loss = F.cross_entropy(model(x[j : j + 32]), y[j : j + 32])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _run(export, watched: bool) -> tuple[object, list[float], NeuralDbg | None, list[str]]:
    """80 steps, the export, 80 more; what the export gave, the losses, the debugger and the warnings raised."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    dbg = NeuralDbg(model) if watched else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if dbg is not None:
            dbg.attach()
        losses = _train(model, opt, 0, 80)
        model.eval()
        exported = export(model)
        model.train()
        losses += _train(model, opt, 80, 80)
        if dbg is not None:
            dbg.close()
    return exported, losses, dbg, [f"{w.category.__name__}: {w.message}" for w in caught]


def _unmangled(traced: object) -> str:
    """A traced module's graph, without the numbers TorchScript gives each class it compiles in a process."""
    return re.sub(r"___torch_mangle_\d+\.", "", str(traced.graph))  # type: ignore[attr-defined]


def test_a_jit_trace_inside_the_block_records_the_model_alone_and_the_run_is_observed_to_its_end():
    sample = _data()[0][:4]
    traced, losses, dbg, caught = _run(lambda m: torch.jit.trace(m, sample), watched=True)  # with its check
    plain_traced, plain_losses, _, plain_caught = _run(lambda m: torch.jit.trace(m, sample), watched=False)
    assert losses == plain_losses  # the training did not change
    assert plain_losses[-1] < 0.5 * plain_losses[0]  # a healthy run: it learns
    assert caught == plain_caught  # no TracerWarning from the debugger's operations, nothing else either
    assert _unmangled(traced) == _unmangled(plain_traced)
    assert dbg is not None and dbg.steps == 160
    assert dbg.explain_failure() == []


@pytest.mark.filterwarnings("ignore:is_fx_tracing will return true")
def test_torch_export_inside_the_block_holds_the_models_operations_alone_and_the_run_is_observed_to_its_end():
    sample = (_data()[0][:4],)
    program, losses, dbg, _ = _run(lambda m: torch.export.export(m, sample), watched=True)
    plain_program, plain_losses, _, _ = _run(lambda m: torch.export.export(m, sample), watched=False)
    assert losses == plain_losses
    targets = [str(n.target) for n in program.graph.nodes]  # type: ignore[attr-defined]
    assert targets == [str(n.target) for n in plain_program.graph.nodes]  # type: ignore[attr-defined]
    assert not any("norm" in t for t in targets)
    assert dbg is not None and dbg.steps == 160
    assert dbg.explain_failure() == []


def test_torch_compile_inside_the_block_is_still_measured_in_its_graph():
    """The export check leaves ``torch.compile`` as it was: the debugger on a compiled module still measures its
    layers from inside the compiled graph (a compile is no export)."""
    model = _model()
    compiled = torch.compile(model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = _data()
    with NeuralDbg(compiled) as dbg:
        for i in range(4):
            opt.zero_grad()
            F.cross_entropy(compiled(x[i * 32 : (i + 1) * 32]), y[i * 32 : (i + 1) * 32]).backward()
            opt.step()
    assert dbg.steps == 4
    assert dbg.history.get("output_rms", "0") is not None  # a layer's output read from inside the graph
