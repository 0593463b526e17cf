"""Per-unit statistics of a full forward pass taken together at its end: each layer's reading must still be its
output as the hook saw it, also when a later module modifies that output in place."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.stats.step import StepData


class Zeroed(nn.Module):
    """Zeroes its input in place on the steps listed in ``on`` (an old-style in-place cleanup)."""

    def __init__(self) -> None:
        super().__init__()
        self.on: set[int] = set()
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step in self.on:
            x.mul_(0.0)
        return x


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i in range(10):  # ten gated layers of one shape: their dead-unit counts are reduced in one batch
        layers += [nn.Linear(16, 16), nn.LeakyReLU(0.0)]
        if i == 3:
            layers.append(Zeroed())
    return nn.Sequential(*layers, nn.Linear(16, 1))


def _run(on: set[int]) -> tuple[list[StepData], list[dict[str, int]]]:
    model = _model()
    zeroed = next(m for m in model if isinstance(m, Zeroed))
    zeroed.on = on
    acts = [name for name, m in model.named_children() if isinstance(m, nn.LeakyReLU)]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    records: list[StepData] = []
    expected: list[dict[str, int]] = []
    dbg = NeuralDbg(model, preset="full")
    dbg._recorder._sink = records.extend  # the raw records instead of the detectors
    with dbg:
        for step in range(6):
            zeroed.step = step
            seen: dict[str, int] = {}

            def count(m: nn.Module, i: object, o: torch.Tensor, name: str, seen: dict[str, int] = seen) -> None:
                seen[name] = int((o.detach().amax(dim=0) <= 0).sum())  # units silent on the whole batch

            handles = [
                model.get_submodule(n).register_forward_hook(lambda m, i, o, n=n: count(m, i, o, n)) for n in acts
            ]
            x, y = torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            for h in handles:
                h.remove()
            expected.append(seen)
    return records, expected


def test_dead_units_of_every_layer_are_those_its_hook_saw_when_a_later_module_zeroes_one_in_place_every_step():
    records, expected = _run(on=set(range(6)))
    assert len(records) == 6
    for record, seen in zip(records, expected, strict=True):
        assert record.full
        for name, dead in seen.items():
            assert record.dead[(name, 0)] == (dead, 16)
    # plain torch: the zeroed layer is alive at its hook (a reading after the zeroing would say 16 dead)
    assert all(seen["7"] < 16 for seen in expected)


def test_an_output_zeroed_in_place_on_one_later_step_is_never_read_after_the_zeroing():
    records, expected = _run(on={3})
    for step, (record, seen) in enumerate(zip(records, expected, strict=True)):
        for name, dead in seen.items():
            reading = record.dead.get((name, 0))
            if name == "7" and step == 3:
                assert reading is None or reading == (dead, 16)  # the batch it waited for saw it changed
            else:
                assert reading == (dead, 16)


class _FunctionalStack(nn.Module):
    """Linear layers of one shape, each activated by ``F.relu`` in ``forward`` (no activation module): their dead
    units are counted at the optimizer step from the pre-activation and the weight gradient. Layer ``i`` has its
    first ``i % 4`` units killed by a bias of -100."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(layers))
        self.head = nn.Linear(16, 1)
        with torch.no_grad():
            for i, layer in enumerate(self.layers):
                layer.bias[: i % 4] = -100.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


def _functional_dead(layers: int) -> tuple[list[dict[str, float]], list[dict[str, int]]]:
    model = _FunctionalStack(layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(2)
    records: list[StepData] = []
    expected: list[dict[str, int]] = []
    dbg = NeuralDbg(model, preset="full")
    dbg._recorder._sink = records.extend
    with dbg:
        for _ in range(4):
            pre: dict[str, torch.Tensor] = {}
            handles = [
                layer.register_forward_hook(
                    lambda m, i, o, n=f"layers.{k}", pre=pre: pre.__setitem__(n, o.detach().clone())
                )
                for k, layer in enumerate(model.layers)
            ]
            x, y = torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            for h in handles:
                h.remove()
            # plain torch: units never positive on the batch whose weight row got exactly zero gradient
            truth = {}
            for k, layer in enumerate(model.layers):
                never = (pre[f"layers.{k}"] <= 0).all(dim=0)
                still = (layer.weight.grad == 0).all(dim=1)
                truth[f"layers.{k}"] = int((never & still).sum())
            expected.append(truth)
            opt.step()
    found = [{key[0]: dead for key, (dead, _) in r.func_dead.items()} for r in records]
    return found, expected


def test_dead_units_behind_functional_activations_are_counted_alike_in_one_batch_and_one_by_one():
    """Ten layers of one shape are reduced together (at least MIN_GROUP of them), four one by one: each layer's
    count is the plain-torch count, step by step, in both."""
    for layers in (10, 4):
        found, expected = _functional_dead(layers)
        assert len(found) == len(expected) == 4
        assert any(v for step in expected for v in step.values())  # the ground truth has dead units to count
        assert found == expected
