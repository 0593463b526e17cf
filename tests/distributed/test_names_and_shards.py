"""Layer and parameter names are the user's whatever wraps the model; sharded parameters are read on their
local part. In one process: wrappers that need no process group, and FSDP1/FSDP2 in a one-rank gloo group, whose
gradients are checked against an unwrapped twin trained with plain torch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.model import naming
from neuraldbg.model.shards import Param

pytestmark = pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`:UserWarning")


def make_model(dead: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    if dead:
        with torch.no_grad():
            model[2].bias.fill_(-10.0)  # kills every unit of '3' for these inputs
    return model


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, 8, generator=g)
    return x, x[:, :1] - x[:, 1:2]


def train(model: nn.Module, steps: int, **options: object) -> NeuralDbg:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model, preset="full", **options) as dbg:  # type: ignore[arg-type]
        for step in range(steps):
            x, y = batch(step)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    return dbg


def plain_gradient_norms(steps: int) -> dict[int, dict[str, float]]:
    """Each layer's gradient norm at each step, from an unwrapped twin and plain torch."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out: dict[int, dict[str, float]] = {}
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        out[step] = {
            name: math.sqrt(sum(float(p.grad.norm()) ** 2 for p in layer.parameters()))
            for name, layer in model.named_children()
            if any(True for _ in layer.parameters())
        }
        opt.step()
    return out


# --- wrappers without a process group -------------------------------------------------------------------------


def test_layer_names_are_the_users_through_data_parallel():
    wrapped = nn.DataParallel(make_model(dead=True))
    assert "module.3" in dict(wrapped.named_modules())  # what torch calls it
    dbg = train(wrapped, 8)
    assert dbg.layers[:5] == ["0", "1", "2", "3", "4"]
    assert dbg.model_name == "Sequential"
    (hypothesis,) = dbg.hypotheses()
    assert (hypothesis.kind, hypothesis.root.layer) == (FailureKind.DEAD_NEURONS, "3")
    assert not [e for e in dbg.events if "module" in e.layer or (e.param or "").startswith("module")]
    assert "'module." not in hypothesis.explanation and "'module." not in dbg.export_mermaid_causal_graph()


def test_layer_names_are_the_users_through_an_activation_checkpoint_wrapper():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model = make_model()
    model[2] = checkpoint_wrapper(model[2])
    assert "2._checkpoint_wrapped_module" in dict(model.named_modules())
    names = dict(naming.named_modules(model))
    assert type(names["2"]) is nn.Linear  # the wrapped layer itself is watched, under the wrapper's name
    assert [p.name for p in naming.parameters(model)] == [n for n, _ in make_model().named_parameters()]


def test_a_submodule_the_user_named_module_keeps_its_name():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Linear(4, 4)
            self.head = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.module(x))

    net = Net()
    assert [n for n, _ in naming.named_modules(net)] == ["", "module", "head"]
    assert [p.name for p in naming.parameters(net)] == ["module.weight", "module.bias", "head.weight", "head.bias"]
    wrapped = nn.DataParallel(net)  # the wrapper's own "module" goes, the user's stays
    assert [n for n, _ in naming.named_modules(wrapped)] == ["", "module", "head"]


def test_the_scale_of_a_shard_norm_is_the_square_root_of_the_whole_over_the_part():
    whole = Param("w", torch.zeros(10), numel=40)
    assert whole.factor(10) == 2.0
    assert whole.factor(40) == 1.0
    assert whole.factor(0) == 1.0  # nothing held: nothing is scaled (and nothing is read)
    assert Param("v", torch.zeros(3)).numel == 3


# --- FSDP in a one-rank process group ---------------------------------------------------------------------------


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def fsdp1(model: nn.Module, use_orig_params: bool) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=use_orig_params)


@pytest.mark.parametrize("use_orig_params", [False, True], ids=["flat parameters", "original parameters"])
def test_fsdp1_is_read_per_user_parameter_with_the_gradients_of_an_unwrapped_twin(one_rank, use_orig_params):
    wrapped = fsdp1(make_model(), use_orig_params)
    flat = [n for n, _ in wrapped.named_parameters()]
    assert any("_fsdp_wrapped_module" in n for n in flat)  # what torch calls them
    params = naming.parameters(wrapped)
    assert [(p.name, p.numel) for p in params] == [(n, p.numel()) for n, p in make_model().named_parameters()]
    dbg = train(wrapped, 5)
    assert dbg.layers[:5] == ["0", "1", "2", "3", "4"]
    truth = plain_gradient_norms(5)
    for layer in ("0", "2", "4"):
        series = dict(dbg.history.get("grad_norm", layer).points())
        for step in range(5):
            assert series[step] == pytest.approx(truth[step][layer], rel=1e-5), (layer, step)
    assert dbg.hypotheses() == []
    assert (dbg.meta["rank"], dbg.meta["world_size"], dbg.meta["backend"]) == (0, 1, "gloo")
    assert dbg.job is None  # one rank: nothing to gather


def test_fsdp1_flat_parameters_find_a_dead_layer_without_an_event_at_the_wrapper(one_rank):
    dbg = train(fsdp1(make_model(dead=True), use_orig_params=False), 8)
    (hypothesis,) = dbg.hypotheses()
    assert (hypothesis.kind, hypothesis.root.layer) == (FailureKind.DEAD_NEURONS, "3")
    vanishing = {e.layer for e in hypothesis.chain if e.kind is FailureKind.VANISHING_GRADIENTS}
    assert vanishing == {"0", "2"}  # the layers upstream of the dead ReLU, by their names
    assert all(e.layer != "" for e in dbg.events if e.kind is FailureKind.VANISHING_GRADIENTS)


def test_fsdp2_is_read_on_dtensor_shards_with_the_gradients_of_an_unwrapped_twin(one_rank):
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    fully_shard(model[0])
    fully_shard(model)
    assert type(model[0]).__name__ == "FSDPLinear" and type(model[0].weight).__name__ == "DTensor"
    dbg = train(model, 5)
    assert dbg.layers[:5] == ["0", "1", "2", "3", "4"]
    assert dbg.model_name == "Sequential"
    types = {layer["name"]: layer["type"] for layer in dbg.to_dict()["model"]["layers"]}
    assert types["0"] == "Linear"  # fully_shard's generated FSDPLinear is the user's Linear
    truth = plain_gradient_norms(5)
    for layer in ("0", "2", "4"):
        series = dict(dbg.history.get("grad_norm", layer).points())
        for step in range(5):
            assert series[step] == pytest.approx(truth[step][layer], rel=1e-5), (layer, step)
    assert dbg.hypotheses() == []
