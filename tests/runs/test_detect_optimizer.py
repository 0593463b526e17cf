"""What the optimizer does to the parameters (checked with plain torch): frozen parameters, stalled updates and
converged fits, and the healthy twins of each that must stay silent."""

from __future__ import annotations

import math

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind

# --------------------------------------------------------------------------------------------- optimizer


def test_a_layer_left_out_of_the_optimizer_has_frozen_parameters_at_that_layer():
    torch.manual_seed(0)
    model = support.mlp()
    optimizer = torch.optim.Adam(list(model[2:].parameters()), lr=1e-3)
    before = model[0].weight.detach().clone()

    dbg, _ = support.train(model, support.regression_batches(), optimizer=optimizer)

    assert torch.equal(before, model[0].weight)  # plain torch: never changed
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.FROZEN_PARAMETERS
    assert top.root.layer == "0"
    assert top.root.step_start == 0
    assert {e.param for e in top.chain} == {"0.weight", "0.bias"}
    assert "not in any optimizer" in top.explanation


def test_a_second_optimizer_whose_step_is_never_called_leaves_its_layer_frozen_and_says_so():
    """Hunt 21: a sparse embedding under its own SparseAdam whose step() was forgotten; the text said "not in any
    optimizer", though it was in one. Here a second Adam holds the first layer and only the first Adam steps."""
    torch.manual_seed(0)
    model = support.mlp()
    body = torch.optim.Adam(list(model[2:].parameters()), lr=1e-3)
    first = torch.optim.Adam(list(model[0].parameters()), lr=1e-3)
    before = model[0].weight.detach().clone()
    batches = support.regression_batches()
    with support.NeuralDbg(model) as dbg:
        for step in range(60):
            x, y = batches(step)
            body.zero_grad()
            first.zero_grad()
            F.mse_loss(model(x), y).backward()
            body.step()  # first.step() forgotten

    assert torch.equal(before, model[0].weight)  # plain torch: never changed
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.FROZEN_PARAMETERS and top.root.layer == "0"
    assert "in one whose step() is never called" in top.explanation
    assert "a second optimizer needs its own step()" in top.suggestion


def test_two_players_stepped_on_alternate_steps_are_not_frozen_on_each_others_turn():
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
    critic = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    model = nn.Sequential(generator, critic)
    opts = [torch.optim.Adam(critic.parameters(), lr=1e-3), torch.optim.Adam(generator.parameters(), lr=1e-3)]
    batches = support.regression_batches(in_features=8)
    changed: list[bool] = []
    graded: list[bool] = []
    with support.NeuralDbg(model) as dbg:
        for step in range(80):  # the critic's optimizer steps on even steps, the generator's on odd ones
            x, y = batches(step)
            for opt in opts:
                opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            before = generator[0].weight.detach().clone()
            opts[step % 2].step()
            changed.append(not torch.equal(before, generator[0].weight))
            graded.append(bool(generator[0].weight.grad.abs().sum() > 0))
    # plain torch: the generator gets a gradient at every step and moves at every odd step, never at even ones
    assert all(graded) and changed == [step % 2 == 1 for step in range(80)]

    assert FailureKind.FROZEN_PARAMETERS not in {h.kind for h in dbg.hypotheses()}, dbg.report()


def test_a_param_group_with_learning_rate_zero_is_frozen():
    torch.manual_seed(0)
    model = support.cnn()
    groups = [
        {"params": model[0].parameters(), "lr": 0.0},
        {"params": list(model[1:].parameters()), "lr": 1e-3},
    ]
    dbg, _ = support.train(
        model,
        support.classification_batches((3, 8, 8), 10, batch=16),
        F.cross_entropy,
        steps=12,
        optimizer=torch.optim.SGD(groups, lr=1e-3, momentum=0.9),
    )
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.FROZEN_PARAMETERS
    assert top.root.layer == "0"
    assert "learning rate 0" in top.explanation


def test_a_backbone_frozen_on_purpose_with_requires_grad_false_is_not_reported():
    torch.manual_seed(0)
    model = support.mlp()
    for p in model[:4].parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    dbg, _ = support.train(model, support.regression_batches(), optimizer=optimizer)
    assert dbg.hypotheses() == []


def test_a_head_left_out_of_the_optimizer_beside_a_backbone_frozen_on_purpose_is_frozen_not_stalled():
    torch.manual_seed(0)
    model = support.mlp()
    for p in model[:8].parameters():  # the backbone, frozen on purpose
        p.requires_grad_(False)
    optimizer = torch.optim.Adam(model[:8].parameters(), lr=1e-3)  # meant model[8:]: the head is left out
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    before = model[8].weight.detach().clone()
    graded: list[bool] = []

    def check(step: int, opt: torch.optim.Optimizer) -> None:
        if step > 0:
            graded.append(bool(model[8].weight.grad.abs().sum() > 0))

    dbg, _ = support.train(model, support.regression_batches(), optimizer=optimizer, on_step=check)

    # plain torch: the head is trainable, gets a gradient at every step, is in no param_group and never moves
    assert model[8].weight.requires_grad and all(graded) and len(graded) == 39
    assert id(model[8].weight) not in held and torch.equal(before, model[8].weight)
    hypotheses = dbg.hypotheses()
    assert [h.kind for h in hypotheses] == [FailureKind.FROZEN_PARAMETERS], dbg.report()
    (top,) = hypotheses
    assert top.root.layer == "8" and {e.param for e in top.chain} == {"8.weight", "8.bias"}
    assert "not in any optimizer" in top.explanation and "frozen backbone" in top.explanation


def test_a_zero_initialised_head_left_out_of_the_optimizer_is_the_root_of_the_zero_gradients_behind_it():
    torch.manual_seed(0)
    model = support.mlp()
    nn.init.zeros_(model[8].weight)
    optimizer = torch.optim.Adam(model[:8].parameters(), lr=1e-3)  # the head left out
    head_grads: list[float] = []
    body_grads: list[float] = []

    def check(step: int, opt: torch.optim.Optimizer) -> None:
        if step > 0:
            head_grads.append(float(model[8].weight.grad.norm()))
            body_grads.append(max(float(model[i].weight.grad.abs().max()) for i in (0, 2, 4, 6)))

    dbg, _ = support.train(model, support.regression_batches(), optimizer=optimizer, on_step=check)

    # plain torch: the head's weight stays all zeros while its gradient is not: nothing passes back through it
    assert bool((model[8].weight == 0).all()) and min(head_grads) > 0.01
    assert max(body_grads) == 0.0
    hypotheses = dbg.hypotheses()
    assert len(hypotheses) == 1, dbg.report()  # the zero gradients behind the head are its effect, not a root
    (top,) = hypotheses
    assert top.kind is FailureKind.FROZEN_PARAMETERS and top.root.layer == "8"
    victims = {e.layer for e in top.chain if e.kind is FailureKind.VANISHING_GRADIENTS}
    assert victims == {"0", "2", "4", "6"}
    assert "'8.weight' is all zeros" in top.explanation


def test_a_zero_initialised_head_in_the_optimizer_trains_without_a_hypothesis():
    torch.manual_seed(0)
    model = support.mlp()
    nn.init.zeros_(model[8].weight)
    dbg, losses = support.train(model, support.regression_batches(), steps=60)
    assert not bool((model[8].weight == 0).all()) and sum(losses[-5:]) < 0.5 * sum(losses[:5])  # it learns
    assert dbg.hypotheses() == [], dbg.report()


def test_a_frozen_head_that_is_not_zero_does_not_claim_zero_gradients_it_did_not_cause():
    class Blocked(nn.Module):  # the branch is multiplied by 0 in forward: its gradient is exactly zero
        def __init__(self) -> None:
            super().__init__()
            self.branch, self.skip, self.head = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.skip(x) + 0.0 * self.branch(x)))

    torch.manual_seed(0)
    model = Blocked()
    optimizer = torch.optim.Adam([*model.branch.parameters(), *model.skip.parameters()], lr=1e-3)  # head left out
    support.one_backward(model, support.regression_batches()(0))
    assert float(model.branch.weight.grad.abs().max()) == 0.0 < float(model.head.weight.grad.norm())  # plain torch

    dbg, _ = support.train(model, support.regression_batches(), optimizer=optimizer)

    kinds = [h.kind for h in dbg.hypotheses()]
    assert sorted(kinds) == sorted([FailureKind.FROZEN_PARAMETERS, FailureKind.VANISHING_GRADIENTS]), dbg.report()
    frozen = next(h for h in dbg.hypotheses() if h.kind is FailureKind.FROZEN_PARAMETERS)
    assert frozen.root.layer == "head" and all(e.layer == "head" for e in frozen.chain)


def test_a_learning_rate_of_0_on_every_group_is_one_stall_and_a_head_left_out_stays_frozen_beside_it():
    torch.manual_seed(0)
    model = support.mlp()
    before = [p.detach().clone() for p in model.parameters()]
    dbg, _ = support.train(
        model, support.regression_batches(), optimizer=torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9)
    )
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # plain torch: nothing moved
    assert [h.kind for h in dbg.hypotheses()] == [FailureKind.STALLED_UPDATES], dbg.report()
    assert "the learning rate is 0" in dbg.hypotheses()[0].explanation

    torch.manual_seed(0)
    model = support.mlp()
    dbg, _ = support.train(
        model, support.regression_batches(), optimizer=torch.optim.SGD(model[:8].parameters(), lr=0.0)
    )
    by_kind = {h.kind: h for h in dbg.hypotheses()}
    assert set(by_kind) == {FailureKind.STALLED_UPDATES, FailureKind.FROZEN_PARAMETERS}, dbg.report()
    assert {e.param for e in by_kind[FailureKind.FROZEN_PARAMETERS].chain} == {"8.weight", "8.bias"}


def test_a_loop_that_never_calls_optimizer_step_has_frozen_parameters_not_a_learning_rate_of_0():
    torch.manual_seed(0)
    model = support.mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = support.regression_batches()
    before = [p.detach().clone() for p in model.parameters()]
    with support.NeuralDbg(model) as dbg:
        for step in range(40):
            x, y = batches(step)
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()  # optimizer.step() forgotten
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # plain torch: nothing moved
    (top,) = dbg.hypotheses()
    assert top.kind is FailureKind.FROZEN_PARAMETERS, dbg.report()
    assert "optimizer.step() that is never called" in top.explanation
    assert "learning rate is 0" not in top.explanation


def test_a_learning_rate_of_1e_7_stalls_updates():
    torch.manual_seed(0)
    model = support.mlp()
    dbg, losses = support.train(
        model, support.regression_batches(), optimizer=torch.optim.SGD(model.parameters(), lr=1e-7)
    )
    ref = support.plain_train(
        model, support.regression_batches(), steps=40, optimizer=torch.optim.SGD(model.parameters(), lr=0.0)
    )  # the same batches with no update at all: the losses are the same
    assert max(abs(a - b) for a, b in zip(losses, ref)) < 1e-3 * max(ref)
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.STALLED_UPDATES
    assert top.root.step_start == 0
    assert top.root.metrics["median_update_ratio"] < 1e-5


def test_a_noisy_regression_at_its_least_squares_optimum_is_not_stalled():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.5 * torch.randn(64, 1, generator=g)  # noise: a loss floor of ~0.25
    torch.manual_seed(0)
    model = nn.Linear(16, 1)
    dbg, losses = support.train(
        model, lambda step: (x, y), steps=300, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
    )
    # plain torch: the loss is the least-squares minimum, far above 0, and the gradient went to ~0 with the fit
    design = torch.cat([x, torch.ones(64, 1)], dim=1)
    best = float(F.mse_loss(design @ torch.linalg.lstsq(design, y).solution, y))
    support.one_backward(model, (x, y))
    assert abs(losses[-1] - best) < 1e-4 * best and best > 0.1 and losses[0] / losses[-1] < 100
    assert float(model.weight.grad.norm()) < 1e-4

    assert dbg.hypotheses() == [], dbg.report()


def test_adam_with_a_small_but_workable_learning_rate_is_not_stalled():
    torch.manual_seed(0)
    model = support.mlp()
    dbg, losses = support.train(
        model, support.regression_batches(), steps=80, optimizer=torch.optim.Adam(model.parameters(), lr=1e-4)
    )
    assert sum(losses[-10:]) < 0.9 * sum(losses[:10])  # slow, but learning
    assert dbg.hypotheses() == []


def fit_readings(
    readings: list[tuple[float | None, float | None]], classes: int = 0, warm_start: bool = False
) -> list[bool]:
    """FitProgress over (loss gradient, loss) readings, one per step, with the default thresholds; ``classes``: the
    last dimension of the model's logits (0: none); ``warm_start``: an optimizer held state at the first step."""
    from types import SimpleNamespace

    from neuraldbg import DebugConfig
    from neuraldbg.detectors.base import FitProgress

    fit, ctx = FitProgress(), SimpleNamespace(config=DebugConfig())
    views = [
        SimpleNamespace(
            ctx=ctx,
            data=SimpleNamespace(
                target_grad=tg, loss=loss, classes=classes, label_classes=0, warm_start=warm_start and i == 0
            ),
        )
        for i, (tg, loss) in enumerate(readings)
    ]
    return [fit.converged(view) for view in views]


def test_a_fit_has_converged_when_its_loss_gradient_falls_tenfold_or_its_loss_a_hundredfold_and_not_after_it_rises():
    # the loss's gradient alone: converged at a tenth of its first value, no longer once it climbs back
    assert fit_readings([(1.0, None), (0.2, None), (0.1, None), (0.05, None), (0.5, None)]) == [
        *(False, False, True, True, False)
    ]
    # the observed loss alone (a gradient that fell only threefold): converged at a hundredth of its first value
    assert fit_readings([(0.9, 8.0), (0.6, 1.0), (0.3, 0.08), (0.3, 0.5)]) == [False, False, True, False]
    # a loss at or below 0 (a log-likelihood) is never compared; non-finite readings are skipped
    assert fit_readings([(None, -3.0), (None, -300.0), (float("nan"), 0.0)]) == [False, False, False]
    assert fit_readings([(0.0, None), (0.0, None)]) == [False, False]  # no gradient at all: not a fit
    # a classifier's cross-entropy starting at chance, its loss the model's output (the gradient w.r.t. it is 1):
    # converged once the probability left off the right class, 1 - exp(-loss), is a tenth of its first value
    # (binary: 0.5 at log 2, so at a loss of 0.051), not only at a hundredth of the loss (0.0069)
    binary = [(1.0, math.log(2)), (1.0, 0.06), (1.0, 0.05), (1.0, 0.3)]
    assert fit_readings(binary, classes=2) == [False, False, True, False]
    assert fit_readings(binary, classes=0) == [False, False, False, False]  # no logits: the hundredfold rule
    assert fit_readings([(1.0, 2.0), (1.0, 0.05)], classes=2) == [False, False]  # 2.9 log 2 at first: not at chance
    # a classifier met mid-training (its optimizer held state) far below chance had learned: measured from chance
    resumed = [(1.0, 0.02), (1.0, 0.015), (1.0, 0.3)]
    assert fit_readings(resumed, classes=2, warm_start=True) == [True, True, False]
    assert fit_readings(resumed, classes=2) == [False, False, False]  # a fresh run that low: a loss scaled down
    assert fit_readings([(1.0, 0.2), (1.0, 0.05)], classes=2, warm_start=True) == [False, False]  # not far below


class SkipTower(nn.Module):
    """A linear path from the input to the head, beside a deep sigmoid tower whose gradients vanish from init."""

    def __init__(self) -> None:
        super().__init__()
        self.tower = support.mlp(width=32, depth=10, out=8, act=nn.Sigmoid)
        self.head = nn.Linear(16 + 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([x, self.tower(x)], dim=1))


@pytest.mark.parametrize("loss_reported", [False, True], ids=["loss-gradient", "observed-loss"])
def test_a_deep_residual_net_overfitting_one_batch_is_healthy_as_its_gradients_shrink_with_the_loss(
    loss_reported: bool,
):
    torch.manual_seed(0)
    model = support.ResidualNet()
    x, y = support.regression_batches()(0)
    support.one_backward(model, (x, y))
    first = support.grad_norms(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []
    with support.NeuralDbg(model) as dbg:
        for _ in range(200):
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            if loss_reported:
                dbg.observe_loss(loss)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    support.one_backward(model, (x, y))
    last = support.grad_norms(model)
    # plain torch: the loss fell by more than three orders of magnitude, the LayerNorm gradients with it from a
    # healthy start to below the vanishing threshold (1e-4, under 1e-3 of the largest layer's)
    assert losses[-1] < 1e-3 * losses[0]
    assert first["blocks.15.norm.weight"] > 0.1 and last["blocks.15.norm.weight"] < 1e-4
    assert last["blocks.15.norm.weight"] < 1e-3 * max(last.values())

    assert dbg.hypotheses() == [], dbg.report()


def test_gradients_that_vanish_from_the_start_are_reported_to_the_end_however_far_the_loss_falls():
    torch.manual_seed(0)
    model = SkipTower()
    batch = support.regression_batches()(0)
    support.one_backward(model, batch)
    first = support.grad_norms(model)
    dbg, losses = support.train(
        model, lambda step: batch, steps=300, optimizer=torch.optim.Adam(model.parameters(), lr=3e-2)
    )
    # plain torch: the tower's gradients vanish from step 0, while the head fits the batch through the linear path
    assert first["tower.0.weight"] < 1e-6 < 1 < first["head.weight"]
    assert losses[-1] < 1e-3 * losses[0]

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.VANISHING_GRADIENTS and top.root.layer.startswith("tower.")
    assert top.root.step_start == 0
    assert top.root.metrics.get("ongoing") == 1.0, dbg.report()  # still vanishing at the end of the converged fit
