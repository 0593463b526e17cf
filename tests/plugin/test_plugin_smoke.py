"""``smoke_train`` and the fixture object, used directly (no inner pytest run)."""

from __future__ import annotations

import random

import pytest
import support
import torch
import torch.nn.functional as F

from pytest_neuraldbg.fixture import NeuralDbgFixture
from pytest_neuraldbg.options import Settings
from pytest_neuraldbg.smoke import batches


def fixture(**settings: object) -> NeuralDbgFixture:
    return NeuralDbgFixture(Settings(**settings))  # type: ignore[arg-type]


def make_batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    make = support.regression_batches()
    return [make(i) for i in range(n)]


def test_the_same_seed_gives_the_same_training_and_diagnosis() -> None:
    runs = []
    for global_seed in (1, 2):
        torch.manual_seed(0)
        model = support.mlp(width=8, depth=2)  # the same start
        torch.manual_seed(global_seed)  # a different global RNG state: smoke_train's seed decides
        dropout = torch.nn.Sequential(model, torch.nn.Dropout(0.5))  # consumes random numbers in training
        ndbg = fixture().smoke_train(dropout, make_batches(3), F.mse_loss, steps=12, seed=7)
        runs.append((ndbg.history.get("loss", "").points(), [p.detach().clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_random_states_are_restored_afterwards() -> None:
    model = support.mlp(width=8, depth=2)
    torch.manual_seed(123)
    random.seed(123)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(123)
    random.seed(123)
    fixture().smoke_train(torch.nn.Sequential(model, torch.nn.Dropout()), make_batches(2), F.mse_loss, steps=3)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_data_shorter_than_the_steps_is_cycled_and_generators_are_replayed() -> None:
    data = make_batches(2)
    assert [id(b) for b, _ in zip(batches(data), range(5))] == [id(data[i % 2]) for i in range(5)]
    one_shot = iter(data)
    assert [id(b) for b, _ in zip(batches(one_shot), range(5))] == [id(data[i % 2]) for i in range(5)]
    assert [b for b, _ in zip(batches(lambda step: step * 10), range(3))] == [0, 10, 20]


def test_a_dataloader_works_and_the_debugger_counts_every_step() -> None:
    x, y = support.regression_batches()(0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    ndbg = fixture().smoke_train(support.mlp(width=8, depth=2), loader, F.mse_loss, steps=9)
    assert ndbg.steps == 9 and not ndbg.attached and ndbg.step_mode == "optimizer"


def test_an_optimizer_factory_is_called_with_the_parameters_and_the_model_mode_is_kept() -> None:
    model = support.mlp(width=8, depth=2).eval()
    made = []

    def sgd(params):
        made.append(torch.optim.SGD(params, lr=0.01, momentum=0.9))
        return made[-1]

    fixture(steps=4).smoke_train(model, make_batches(1), F.mse_loss, optimizer=sgd)
    assert len(made) == 1 and not model.training
    given = [p for group in made[0].param_groups for p in group["params"]]
    assert [id(p) for p in given] == [id(p) for p in model.parameters()]  # called with the model's parameters
    # and it is the optimizer that trained: each step left its momentum buffer on every parameter
    assert set(made[0].state) == set(given) and all("momentum_buffer" in s for s in made[0].state.values())


def test_bad_data_fails_with_a_clear_message() -> None:
    model = support.mlp(width=8, depth=2)
    with pytest.raises(ValueError, match="data yielded no batches"):
        fixture().smoke_train(model, [], F.mse_loss, steps=2)
    with pytest.raises(TypeError, match=r"each batch must be an \(inputs, targets\) pair, got tuple of length 3"):
        fixture().smoke_train(model, [(1, 2, 3)], F.mse_loss, steps=2)
    with pytest.raises(ValueError, match="steps must be a positive integer, got 0"):
        fixture().smoke_train(model, make_batches(1), F.mse_loss, steps=0)


def test_session_settings_reach_the_debugger_and_call_arguments_win() -> None:
    fx = fixture(preset="full", persistence=4)
    assert (fx(support.mlp()).config.full_every, fx(support.mlp()).config.persistence) == (1, 4)
    assert fx(support.mlp(), persistence=2).config.persistence == 2
    assert fx(support.mlp(), {"persistence": 5}).config.persistence == 5
    assert [name for name, _ in fx.named_runs] == ["1", "2", "3", "4"]
    fx2 = fixture()
    fx2(support.mlp(), name="a")
    fx2(support.mlp(), name="a")
    assert [name for name, _ in fx2.named_runs] == ["a", "a-2"]
