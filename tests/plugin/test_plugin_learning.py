"""``assert_learns`` and ``smoke_train(overfit=True)``: does the loss fall on one batch, and if not, why?

Every scenario's ground truth is checked with plain torch on the model after training: its loss on the batch it
trained on, measured without the debugger, and the fault itself (weights that never changed, a layer whose
pre-activations are never positive).
"""

from __future__ import annotations

import math

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

import neuraldbg
from pytest_neuraldbg import assert_learns, learning
from pytest_neuraldbg.errors import ArgumentError
from pytest_neuraldbg.fixture import NeuralDbgFixture
from pytest_neuraldbg.options import Settings

# --- the statistic ---------------------------------------------------------------------------------------------


def test_each_end_is_the_median_of_a_fifth_of_the_points_between_one_and_ten() -> None:
    assert [learning.window(n) for n in (2, 9, 10, 50, 51, 200)] == [1, 1, 2, 10, 10, 10]
    points = [(s, 1.0) for s in range(5)] + [(s, 0.4) for s in range(5, 10)]
    drop = learning.loss_drop(points)
    assert (drop.first, drop.last, drop.window, drop.fell_by) == (1.0, 0.4, 2, 2.5)
    assert drop.learned(2.5) and not drop.learned(2.6)


def test_one_spike_at_either_end_does_not_decide() -> None:
    steady = [(s, 1.0) for s in range(50)]
    spiked = [(0, 9.0), *steady[1:49], (49, 50.0)]  # a bad first batch, an outlier last batch
    assert learning.loss_drop(spiked).fell_by == 1.0  # medians: the loss did not move
    assert not learning.loss_drop(spiked).learned(2.0)
    assert learning.loss_drop([(0, 2.0), (1, 1.0)]).fell_by == 2.0  # two points: first against last


def test_a_loss_that_ends_non_finite_did_not_learn() -> None:
    drop = learning.loss_drop([(0, 1.0), (1, 0.5), (2, math.nan)])
    assert math.isnan(drop.last) and not drop.learned(1.5)
    assert "it became non-finite" in learning.verdict_line(drop, 2.0, 3)


def test_the_curve_shows_ten_evenly_spread_points_first_and_last_included() -> None:
    points = [(s, 1.0 / (s + 1)) for s in range(50)]
    shown = learning.curve(points).split(", ")
    assert len(shown) == 10 and shown[0] == "0: 1" and shown[-1] == "49: 0.02"
    assert learning.curve(points[:3]) == "0: 1, 1: 0.5, 2: 0.3333"


def test_the_verdict_line_says_how_far_the_loss_moved_and_how_it_was_measured() -> None:
    fell = learning.loss_drop([(s, 1.0 - 0.01 * s) for s in range(50)])
    assert learning.verdict_line(fell, 2.0, 50) == (
        "NeuralDBG: the loss did not fall by 2x over 50 steps: 0.955 -> 0.555 (fell 1.72x; median of the first and "
        "the last 10 recorded losses)"
    )
    rose = learning.loss_drop([(0, 1.0), (1, 2.0)])
    assert learning.verdict_line(rose, 2.0, 2).endswith("1 -> 2 (rose 2x; first and last recorded loss)")


# --- scenarios, ground truth in plain torch --------------------------------------------------------------------


def fixture() -> NeuralDbgFixture:
    return NeuralDbgFixture(Settings())


def batches(shape: tuple[int, ...] = (16,), batch: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    make = support.classification_batches(shape, classes=2, batch=batch)
    return [make(i) for i in range(3)]


def batch_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    """The model's loss on ``batch``, in plain torch, without the debugger."""
    with torch.no_grad():
        return float(F.cross_entropy(model(batch[0]), batch[1]))


def classifier() -> nn.Sequential:
    torch.manual_seed(0)
    return support.mlp(width=64, depth=2, out=2)  # '0' Linear, '1' ReLU, '2' Linear, '3' ReLU, '4' the head


def test_a_healthy_mlp_learns_one_batch() -> None:
    model, data = classifier(), batches()
    before = batch_loss(model, data[0])
    ndbg = fixture().smoke_train(model, data, F.cross_entropy, overfit=True)
    assert batch_loss(model, data[0]) < before / 2  # ground truth: the batch is being fitted
    assert batch_loss(model, data[1]) > batch_loss(model, data[0])  # and it is that batch, not the others
    assert_learns(ndbg)


def test_a_healthy_cnn_learns_one_batch() -> None:
    torch.manual_seed(0)
    model, data = support.cnn(classes=2), batches((3, 8, 8), batch=16)
    before = batch_loss(model, data[0])
    adam = lambda params: torch.optim.Adam(params, lr=1e-2)
    ndbg = fixture().smoke_train(model, data, F.cross_entropy, optimizer=adam, steps=60, overfit=True)
    assert batch_loss(model, data[0]) < before / 2
    assert_learns(ndbg)


def test_a_head_left_out_of_the_optimizer_fails_and_names_the_frozen_head() -> None:
    model, data = classifier(), batches()
    with torch.no_grad():  # a small head initialisation, as fine-tuning recipes use
        model[4].weight.normal_(0, 1e-3)
        model[4].bias.zero_()
    head = [p.detach().clone() for p in model[4].parameters()]
    backbone = [p for name, p in model.named_parameters() if not name.startswith("4.")]
    before = batch_loss(model, data[0])
    ndbg = fixture().smoke_train(
        model, data, F.cross_entropy, optimizer=torch.optim.Adam(backbone, lr=1e-3), overfit=True
    )
    assert all(torch.equal(a, b) for a, b in zip(head, model[4].parameters()))  # ground truth: the head never moved
    assert batch_loss(model, data[0]) > before / 1.1  # and the loss hardly fell
    with pytest.raises(AssertionError) as info:
        assert_learns(ndbg)
    text = str(info.value)
    assert text.startswith("NeuralDBG: the loss did not fall by 2x over 50 steps: 0.69")
    assert "\n\nLoss curve (step: loss): 0: 0.69" in text
    assert "Why, according to NeuralDBG: training is unhealthy - frozen_parameters at '4' from step 0" in text
    assert "they are not in any optimizer" in text

    # the control: the same model and data with the head in the optimizer do learn
    control = classifier()
    with torch.no_grad():
        control[4].weight.normal_(0, 1e-3)
        control[4].bias.zero_()
    assert_learns(fixture().smoke_train(control, data, F.cross_entropy, overfit=True))


def test_a_learning_rate_of_1e_9_fails_and_names_the_stalled_updates() -> None:
    model, data = classifier(), batches()
    start = [p.detach().clone() for p in model.parameters()]
    before = batch_loss(model, data[0])
    sgd = lambda params: torch.optim.SGD(params, lr=1e-9)
    ndbg = fixture().smoke_train(model, data, F.cross_entropy, optimizer=sgd, overfit=True)
    moved = max(float((p.detach() - s).norm() / s.norm()) for p, s in zip(model.parameters(), start))
    assert moved < 1e-6 and batch_loss(model, data[0]) == pytest.approx(before, rel=1e-4)  # ground truth
    with pytest.raises(AssertionError, match=r"stalled_updates at the model from step 0") as info:
        assert_learns(ndbg)
    assert "(fell 1x; median of the first and the last 10 recorded losses)" in str(info.value)


def test_a_dead_layer_fails_and_names_the_dead_relu() -> None:
    model, data = classifier(), batches()
    with torch.no_grad():
        model[2].bias.fill_(-20.0)
    before = batch_loss(model, data[0])
    ndbg = fixture().smoke_train(model, data, F.cross_entropy, overfit=True)
    pre = support.capture_outputs(model, data[0][0], ["2"])["2"]
    assert float(pre.max()) <= 0  # ground truth: no unit of '3' is ever active on the batch
    assert batch_loss(model, data[0]) > before / 1.1
    with pytest.raises(AssertionError, match=r"training is unhealthy - dead_neurons at '3' from step 0"):
        assert_learns(ndbg)


def test_a_failed_check_with_no_fault_found_says_so() -> None:
    model, data = classifier(), batches()
    ndbg = fixture().smoke_train(model, data, F.cross_entropy, steps=5, overfit=True)  # healthy, but too short
    with pytest.raises(AssertionError, match="NeuralDBG found no training fault in this run"):
        assert_learns(ndbg, factor=100)


def test_the_factor_decides() -> None:
    model, data = classifier(), batches()
    ndbg = fixture().smoke_train(model, data, F.cross_entropy, overfit=True)
    points = ndbg.history.get("loss", "").points()
    fell = learning.loss_drop(points).fell_by
    assert_learns(ndbg, factor=fell * 0.99)
    with pytest.raises(AssertionError):
        assert_learns(ndbg, factor=fell * 1.01)


# --- where the loss comes from ---------------------------------------------------------------------------------


def own_loop(ndbg_factory, model: nn.Module, data, *, observe: bool, steps: int = 30):  # type: ignore[no-untyped-def]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with ndbg_factory(model) as ndbg:
        for step in range(steps):
            x, y = data[step % len(data)]
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            if observe:
                ndbg.observe_loss(loss)
            loss.backward()
            opt.step()
    return ndbg


def test_a_loop_that_never_names_the_loss_is_judged_on_the_loss_recorded_from_its_backward_pass() -> None:
    torch.manual_seed(0)
    model = classifier()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    recorded = own_loop(fixture(), model, batches()[:1], observe=False, steps=60)
    model.load_state_dict(state)
    observed = own_loop(fixture(), model, batches()[:1], observe=True, steps=60)
    points, given = recorded.history.get("loss", "").points(), observed.history.get("loss", "").points()
    assert [s for s, _ in points] == [s for s, _ in given] == list(range(60))
    assert [v for _, v in points] == pytest.approx([v for _, v in given], rel=1e-6)
    assert_learns(recorded)  # the one batch's loss halves within 60 steps, as with observe_loss


def test_a_loop_whose_backward_pass_starts_from_no_loss_is_told_how_to_record_it() -> None:
    model = classifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = batches()[:1]
    with fixture()(model) as ndbg:
        for _step in range(30):
            x, y = data[0]
            opt.zero_grad()
            out = model(x)
            grad = torch.autograd.grad(F.cross_entropy(out, y), out)[0]
            out.backward(gradient=grad)  # the gradient handed in: no loss tensor reaches backward()
            opt.step()
    with pytest.raises(ArgumentError, match=r"Call ndbg.observe_loss\(loss\) once per step"):
        assert_learns(ndbg)
    assert isinstance(ArgumentError("x"), ValueError)  # not an AssertionError: pytest.raises(AssertionError) misses it


def test_a_loop_that_records_the_loss_is_judged_and_so_is_its_saved_trace(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ndbg = own_loop(fixture(), classifier(), batches()[:1], observe=True, steps=60)
    assert_learns(ndbg)
    ndbg.save(tmp_path / "run.json")
    assert_learns(neuraldbg.load(tmp_path / "run.json"))


def test_a_run_that_took_no_step_did_not_learn() -> None:
    ndbg = own_loop(fixture(), classifier(), [], observe=True, steps=0)
    with pytest.raises(AssertionError, match=r"it took no training step \(0 steps observed\)"):
        assert_learns(ndbg)


def test_a_loss_that_starts_negative_cannot_be_judged_by_a_factor() -> None:
    model, data = classifier(), batches()
    negative = lambda out, target: F.cross_entropy(out, target) - 10
    ndbg = fixture().smoke_train(model, data, negative, steps=5, overfit=True)
    with pytest.raises(
        ArgumentError, match=r"needs a positive loss; this run's starts at -9\.\d+ \(its first recorded loss\)"
    ):
        assert_learns(ndbg)


def test_overfit_trains_on_the_first_batch_only() -> None:
    seen: list[int] = []
    data = batches()

    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        seen.append(next(i for i, (_, y) in enumerate(data) if y is target))
        return F.cross_entropy(out, target)

    fixture().smoke_train(classifier(), data, loss, steps=7, overfit=True)
    assert seen == [0] * 7
    seen.clear()
    fixture().smoke_train(classifier(), data, loss, steps=7)
    assert seen == [0, 1, 2, 0, 1, 2, 0]
