"""A loss by value on the output of an activation whose range does not hold the targets (a ReLU or a sigmoid on the
output of an autoencoder of standardised data), found from the loss graph and one profile of the saved target.
Ground truth is plain torch in each test (the loss held above the floor the out-of-range targets set, the twin
without the activation below it); outputs whose range holds their targets stay silent, and training is
bit-identical."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.kinds import unreachable_targets
from neuraldbg.stats.tensors import out_of_range

KIND = "unreachable_targets"


def autoencoder(last: nn.Module | None) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(20, 8), nn.ReLU(), nn.Linear(8, 20)]
    if last is not None:
        layers.append(last)
    return nn.Sequential(*layers)


def data(low: float = -1.0, high: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    basis = torch.rand(4, 20, generator=g) * 2 - 1  # low-rank structure the bottleneck can learn
    codes = torch.rand(2048, 4, generator=g)
    x = (codes @ basis) / 2
    return low + (high - low) * (x - x.min()) / (x.max() - x.min())


def train(model: nn.Module, x: torch.Tensor, steps: int, watched: bool, loss_fn=F.mse_loss):
    torch.manual_seed(1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []

    def loop() -> None:
        g = torch.Generator().manual_seed(2)
        for _ in range(steps):
            batch = x[torch.randint(0, len(x), (64,), generator=g)]
            loss = loss_fn(model(batch), batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))

    if not watched:
        loop()
        return losses, None
    with NeuralDbg(model) as dbg:
        loop()
    return losses, dbg


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


@pytest.mark.parametrize(("last", "name"), [(nn.ReLU(), "ReLU"), (nn.Sigmoid(), "sigmoid")])
def test_a_bounded_output_before_standardised_targets_is_held_above_their_floor_and_found(last: nn.Module, name: str):
    x = data(-1.0, 1.0)
    floor = float((x - x.clamp(0.0, 1.0)).pow(2).mean())  # the least MSE an output in [0, 1] or [0, inf) reaches
    torch.manual_seed(0)
    losses, _ = train(autoencoder(last), x, 300, watched=False)
    torch.manual_seed(0)
    twin, _ = train(autoencoder(None), x, 300, watched=False)
    # plain torch: the bounded output stays above the floor (a batch's own floor varies around it); the linear twin
    # goes far below it
    assert sum(losses[-20:]) / 20 >= 0.9 * floor
    assert sum(twin[-20:]) / 20 < 0.5 * floor

    torch.manual_seed(0)
    watched, dbg = train(autoencoder(last), x, 300, watched=True)
    assert watched == losses
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND
    root = hits[0].root
    assert root.layer == "3" and root.detail == name and root.step_start == 0
    assert root.metrics["share"] > 0.3
    assert abs(root.metrics["floor"] - floor) < 0.2 * floor  # one batch's estimate of it
    assert name in hits[0].explanation and "remove the" in hits[0].explanation


def test_a_huber_loss_on_a_relu_output_is_judged_as_the_mse_is():
    torch.manual_seed(0)
    _, dbg = train(autoencoder(nn.ReLU()), data(-1.0, 1.0), 20, watched=True, loss_fn=F.huber_loss)
    assert dbg is not None and found(dbg), dbg.explain_failure()


@pytest.mark.parametrize(
    ("last", "low", "high"),
    [
        (nn.Sigmoid(), 0.0, 1.0),  # images in [0, 1] under a sigmoid
        (nn.Tanh(), -1.0, 1.0),  # images in [-1, 1] under a tanh
        (nn.ReLU(), 0.0, 3.0),  # non-negative targets (counts, intensities) under a ReLU
        (None, -1.0, 1.0),  # a linear output
    ],
    ids=["sigmoid_01", "tanh_pm1", "relu_nonnegative", "linear"],
)
def test_outputs_whose_range_holds_their_targets_are_silent(last: nn.Module | None, low: float, high: float):
    x = data(low, high)
    torch.manual_seed(0)
    plain, _ = train(autoencoder(last), x, 60, watched=False)
    torch.manual_seed(0)
    losses, dbg = train(autoencoder(last), x, 60, watched=True)
    assert losses == plain
    assert dbg is not None and not found(dbg), dbg.explain_failure()


def test_a_few_out_of_range_targets_and_binary_targets_on_the_bounds_are_within_reach():
    t = torch.rand(1000)
    t[:20] = -0.5  # 2 % outliers below a ReLU's floor
    share = out_of_range(t, 0.0, float("inf")).tolist()[0]
    assert share == pytest.approx(0.02) and share < unreachable_targets.SHARE
    labels = torch.randint(0, 2, (1000,)).float()  # 0/1 labels under a sigmoid: on the bounds, reachable
    assert out_of_range(labels, 0.0, 1.0).tolist()[:2] == [0.0, 0.0]
    assert out_of_range(torch.empty(0), 0.0, 1.0).tolist() == [0.0, 0.0, 0.0]


def test_a_feature_loss_between_two_relu_outputs_is_silent():
    """A student matching a teacher's post-ReLU features: the target is itself a ReLU's output, in range."""
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(20, 16), nn.ReLU())
    student = nn.Sequential(nn.Linear(20, 16), nn.ReLU())
    x = data(-1.0, 1.0)
    opt = torch.optim.Adam(student.parameters(), lr=1e-3)
    with NeuralDbg(student) as dbg:
        for step in range(30):
            batch = x[step * 32 : (step + 1) * 32]
            with torch.no_grad():
                target = teacher(batch)
            loss = F.mse_loss(student(batch), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert not found(dbg), dbg.explain_failure()


@pytest.mark.parametrize("case", ["few_outliers", "barely_below"])
def test_a_relu_output_with_targets_barely_or_rarely_out_of_range_is_silent(case: str):
    """Plain torch measures what the ReLU cannot reach: a few outliers (under SHARE of the targets) or many
    targets just below 0 (their floor under FLOOR of the variance). Neither is worth a finding."""
    if case == "few_outliers":
        x = data(0.0, 1.0).clone()
        x.view(-1)[::50] = -0.5  # 2 % of the elements
    else:
        x = data(0.0, 1.0).clone()
        low = x < x.flatten().quantile(0.2)
        x[low] = -0.01  # a fifth of the targets a sliver below 0
    share, floor, variance = out_of_range(x, 0.0, float("inf")).tolist()
    if case == "few_outliers":
        assert share < unreachable_targets.SHARE and floor > unreachable_targets.FLOOR * variance
    else:
        assert share > unreachable_targets.SHARE and floor < unreachable_targets.FLOOR * variance
    torch.manual_seed(0)
    _, dbg = train(autoencoder(nn.ReLU()), x, 30, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()


def test_the_value_of_the_action_taken_picked_from_a_relu_output_is_judged():
    """A Q-network whose values pass through a ReLU, the value of each action taken gathered from them and regressed
    onto returns that are mostly negative (a grid with pits): the values cannot go below 0 (plain torch: the loss
    stays far above its twin's without the ReLU); the gather between the ReLU and the loss picks values, it does
    not change their range."""

    class Q(nn.Module):
        def __init__(self, relu: bool) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
            self.relu = relu

        def forward(self, s: torch.Tensor) -> torch.Tensor:
            q = self.net(s)
            return F.relu(q) if self.relu else q

    weights = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))

    def run(relu: bool, watched: bool) -> tuple[list[float], NeuralDbg | None]:
        torch.manual_seed(0)
        model = Q(relu)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses: list[float] = []
        dbg = NeuralDbg(model) if watched else None
        with dbg if dbg is not None else torch.enable_grad():
            for step in range(150):
                g = torch.Generator().manual_seed(step)
                s = torch.randn(64, 8, generator=g)
                a = torch.randint(0, 4, (64, 1), generator=g)
                target = ((s @ weights).gather(1, a) - 1.0).squeeze(1)  # returns, mostly below 0
                opt.zero_grad()
                loss = F.smooth_l1_loss(model(s).gather(1, a).squeeze(1), target)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return losses, dbg

    clamped, _ = run(relu=True, watched=False)
    free, _ = run(relu=False, watched=False)
    assert sum(clamped[-20:]) > 3 * sum(free[-20:])  # plain torch: the ReLU holds the values above the returns
    watched, dbg = run(relu=True, watched=True)
    assert watched == clamped
    assert dbg is not None and found(dbg), dbg.explain_failure()
    _, twin = run(relu=False, watched=True)
    assert twin is not None and not found(twin), twin.explain_failure()
