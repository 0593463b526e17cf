"""The loss of a user's own loop, recorded with no call to NeuralDBG inside it, and the faults whose evidence is in
the loss: gradients not zeroed (proved exactly), a loss stuck at chance, a loss whose gradient is exactly zero on
every step whatever the run's length. Ground truth is plain torch in each test; healthy twins stay silent."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

CLASSES = 10
LOSS_KINDS = {"loss_at_chance", "loss_not_decreasing", "unstable_loss"}


def classifier() -> nn.Sequential:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def batches() -> Callable[[int], support.Batch]:
    return support.classification_batches((32,), CLASSES, batch=64)


def random_labels(step: int) -> support.Batch:
    """Inputs of the learnable task with labels drawn apart from them (a label file of another split)."""
    x, y = batches()(step)
    return x, torch.randint(0, CLASSES, y.shape, generator=torch.Generator().manual_seed(step + 7))


def recorded_losses(dbg: NeuralDbg) -> list[tuple[int, float]]:
    """The losses the debugger recorded on its own, step by step (the first ones, kept one by one)."""
    return list(dbg._recorder.coverage.losses.first)


def loop(
    model: nn.Module,
    make: Callable[[int], support.Batch],
    steps: int,
    optimizer: torch.optim.Optimizer,
    zero: Callable[[], None] | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
    micro: int = 1,
) -> list[float]:
    """A user's loop: no NeuralDBG call inside. ``zero`` resets the gradients (None: never); ``micro`` splits
    each batch into that many micro-batches whose mean losses, divided by ``micro``, accumulate into one step."""
    losses = []
    for step in range(steps):
        x, y = make(step)
        if zero is not None:
            zero()
        total = 0.0
        for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
            loss = loss_fn(model(xs), ys) / micro
            loss.backward()
            total += loss.item()
        optimizer.step()
        losses.append(total)
    return losses


# --------------------------------------------------------------------------------------------- the loss, recorded


@pytest.mark.parametrize("micro", [1, 4])
def test_the_loss_of_each_step_is_recorded_without_observe_loss_and_the_training_is_bit_identical(micro):
    def train(watched: bool) -> tuple[nn.Module, list[float], NeuralDbg | None]:
        torch.manual_seed(0)
        model = classifier()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if not watched:
            return model, loop(model, batches(), 20, opt, opt.zero_grad, micro=micro), None
        with NeuralDbg(model) as dbg:
            losses = loop(model, batches(), 20, opt, opt.zero_grad, micro=micro)
        return model, losses, dbg

    plain, plain_losses, _ = train(False)
    watched, losses, dbg = train(True)
    assert losses == plain_losses  # the run is the same, loss for loss
    for a, b in zip(plain.parameters(), watched.parameters()):
        assert torch.equal(a, b)  # ... and weight for weight
    assert dbg is not None
    recorded = recorded_losses(dbg)
    assert [s for s, _ in recorded] == list(range(16))
    # the loss of a step is the sum of its micro-batches' losses (the mean loss of the whole batch)
    assert [v for _, v in recorded] == pytest.approx(losses[:16], rel=1e-6, abs=1e-7)
    assert dbg._recorder.coverage.losses.count == 20


def test_the_loss_of_a_closure_is_the_one_at_the_parameters_the_step_started_from():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    make = support.regression_batches()
    returned = []
    with NeuralDbg(model) as dbg:
        for step in range(6):
            x, y = make(step)

            def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                return loss

            returned.append(float(opt.step(closure).detach()))
    # LBFGS evaluates the closure several times a step; step() returns the first loss: the one recorded
    assert [v for _, v in recorded_losses(dbg)] == pytest.approx(returned, rel=1e-6)


def test_a_closure_without_zero_grad_is_gradients_not_zeroed_not_oversized_logits():
    """LBFGS evaluates its closure four times a step; without ``zero_grad`` inside it the four gradients add up,
    and so do the four losses recorded from their backward passes (8.8 for 10 classes: four untrained losses of
    about log 10). Plain torch: the first loss LBFGS returns is an untrained classifier's, near log(10); the second
    evaluation's backward pass starts from the first's gradient. The sum is no one forward pass's level: the
    finding is the missing reset."""
    torch.manual_seed(0)
    model = classifier()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=10)
    make = batches()
    returned, carried = [], []
    with NeuralDbg(model) as dbg:
        for step in range(80):
            x, y = make(step)
            calls: list[torch.Tensor | None] = []

            def closure(x: torch.Tensor = x, y: torch.Tensor = y, calls: list = calls) -> torch.Tensor:
                g = model[0].weight.grad
                calls.append(None if g is None else g.clone())
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                return loss

            returned.append(float(opt.step(closure).detach()))
            carried.append(len(calls) > 1 and calls[1] is not None)
    assert returned[0] < 1.2 * math.log(10) and all(carried[1:])  # plain torch
    kinds = [h.kind.value for h in dbg.hypotheses()]
    assert kinds and kinds[0] == "gradients_not_zeroed" and "oversized_logits" not in kinds, dbg.explain_failure()


# --------------------------------------------------------------------------------------------- zero_grad missing


def test_a_missing_zero_grad_is_proved_from_the_gradients_the_optimizer_already_applied():
    torch.manual_seed(0)
    model = classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    make = batches()
    carried = []
    with NeuralDbg(model) as dbg:
        previous = None
        for step in range(30):
            x, y = make(step)
            before = model[0].weight.grad
            # plain torch: the .grad the backward pass starts from is the previous step's, though the optimizer
            # stepped since (no zero_grad in this loop)
            carried.append(before is not None and previous is not None and torch.equal(before, previous))
            F.cross_entropy(model(x), y).backward()
            previous = model[0].weight.grad.clone()
            opt.step()
    assert carried == [False] + [True] * 29

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.GRADIENTS_NOT_ZEROED, dbg.report()
    assert top.root.step_start <= 2
    assert "zero_grad" in top.explanation + top.suggestion


RESETS: dict[str, Callable[[nn.Module, torch.optim.Optimizer], Callable[[], None]]] = {
    "optimizer.zero_grad()": lambda m, o: o.zero_grad,
    "zero_grad(set_to_none=False)": lambda m, o: lambda: o.zero_grad(set_to_none=False),
    "model.zero_grad()": lambda m, o: m.zero_grad,
    "p.grad = None": lambda m, o: lambda: [setattr(p, "grad", None) for p in m.parameters()] and None,
    "p.grad.data.zero_()": lambda m, o: (
        lambda: [p.grad.data.zero_() for p in m.parameters() if p.grad is not None] and None
    ),
}


@pytest.mark.parametrize("reset", sorted(RESETS))
@pytest.mark.parametrize("micro", [1, 4])
def test_every_way_of_zeroing_the_gradients_and_accumulation_stay_silent(reset, micro):
    torch.manual_seed(0)
    model = classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model) as dbg:
        loop(model, batches(), 30, opt, RESETS[reset](model, opt), micro=micro)
    assert FailureKind.GRADIENTS_NOT_ZEROED not in {h.kind for h in dbg.hypotheses()}, dbg.report()
    assert dbg._recorder.coverage.carried_steps == 0


# --------------------------------------------------------------------------------------------- loss at chance


def test_labels_that_do_not_match_the_inputs_leave_the_loss_at_chance_while_the_twin_learns():
    results = {}
    for name, make in (("true", batches()), ("random", random_labels)):
        torch.manual_seed(0)
        model = classifier()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        with NeuralDbg(model) as dbg:
            losses = loop(model, make, 120, opt, opt.zero_grad)
        results[name] = (dbg, losses)
    chance = math.log(CLASSES)
    true_losses, random_losses = results["true"][1], results["random"][1]
    # plain torch: with random labels the loss ends at log(10) (within 2 %); with the true ones far below it
    assert abs(sum(random_losses[-30:]) / 30 - chance) < 0.02 * chance
    assert sum(true_losses[-30:]) / 30 < 0.5 * chance

    faulty = results["random"][0].hypotheses()
    assert faulty and faulty[0].kind is FailureKind.LOSS_AT_CHANCE, results["random"][0].report()
    assert "label" in faulty[0].explanation.lower()
    # the loss graph showed cross_entropy given the raw logits: no softmax before it is offered as a cause
    assert faulty[0].root.metrics.get("logits_read") == 1.0
    assert "softmax before CrossEntropyLoss" not in faulty[0].explanation
    assert not support.kinds(results["true"][0]) & LOSS_KINDS, results["true"][0].report()


def test_huge_weight_decay_holds_the_loss_at_chance():
    torch.manual_seed(0)
    model = classifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1.0)
    with NeuralDbg(model) as dbg:
        losses = loop(model, batches(), 120, opt, opt.zero_grad)
    # plain torch: the loss never leaves log(10); the weights shrink instead of fitting
    assert abs(sum(losses[-30:]) / 30 - math.log(CLASSES)) < 0.02 * math.log(CLASSES)
    # the decay is named, the loss at chance among what it caused (excessive_weight_decay's room)
    top = dbg.hypotheses()[0]
    assert top.kind.value == "excessive_weight_decay" and "a loss at chance" in top.explanation, dbg.report()


def test_a_smoke_run_too_short_to_judge_the_loss_is_not_an_alarm():
    torch.manual_seed(0)
    model = classifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with NeuralDbg(model) as dbg:
        losses = loop(model, random_labels, 30, opt, opt.zero_grad)
    assert abs(sum(losses[-10:]) / 10 - math.log(CLASSES)) < 0.05 * math.log(CLASSES)  # at chance, but 30 steps
    assert not support.kinds(dbg) & LOSS_KINDS, dbg.report()


# --------------------------------------------------------------------------------------------- exactly-zero loss


@pytest.mark.parametrize("steps", [12, 18, 40, 200])
def test_a_loss_whose_gradient_is_exactly_zero_is_degenerate_at_any_run_length(steps):
    torch.manual_seed(0)
    model = classifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    zero_steps = 0

    def zero_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 0.0 * F.cross_entropy(out, y)  # a loss weight that ended up 0

    make = batches()
    with NeuralDbg(model) as dbg:
        for step in range(steps):
            x, y = make(step)
            opt.zero_grad()
            zero_loss(model(x), y).backward()
            zero_steps += all(float(p.grad.abs().max()) == 0.0 for p in model.parameters())
            opt.step()
    assert zero_steps == steps  # plain torch: every gradient exactly zero on every step
    assert FailureKind.DEGENERATE_LOSS in {h.kind for h in dbg.hypotheses()}, dbg.report()


def test_a_policy_gradient_exactly_zero_on_most_steps_is_degenerate():
    torch.manual_seed(0)
    model = classifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    make = batches()
    zero_steps = 0
    with NeuralDbg(model) as dbg:
        for step in range(200):
            x, y = make(step)
            opt.zero_grad()
            advantage = 1.0 if step % 10 == 3 else 0.0  # every return equal to its baseline but on 1 step in 10
            (advantage * F.cross_entropy(model(x), y)).backward()
            zero_steps += all(float(p.grad.abs().max()) == 0.0 for p in model.parameters())
            opt.step()
    assert zero_steps == 180
    assert FailureKind.DEGENERATE_LOSS in {h.kind for h in dbg.hypotheses()}, dbg.report()


# --------------------------------------------------------------------------------------------- unstable loss


def sgd_run(lr: float, steps: int = 160) -> tuple[NeuralDbg, list[float]]:
    torch.manual_seed(0)
    model = classifier()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with NeuralDbg(model) as dbg:
        losses = loop(model, batches(), steps, opt, opt.zero_grad)
    return dbg, losses


def test_a_learning_rate_too_high_for_the_loss_to_settle_but_not_to_explode_is_an_unstable_loss():
    dbg, losses = sgd_run(2.0)
    twin, twin_losses = sgd_run(0.5)
    half = losses[80:]
    # plain torch: finite throughout, ends far above the twin at lr 0.5, and its second half swings, not falls
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-40:]) / 40 > 1.5 * sum(twin_losses[-40:]) / 40
    assert sum(half[:27]) / 27 - sum(half[-27:]) / 27 < 0.1 and max(half) > 2 * min(half)

    hypotheses = dbg.hypotheses()
    assert hypotheses and hypotheses[0].kind is FailureKind.UNSTABLE_LOSS, dbg.report()
    assert "learning rate" in (hypotheses[0].explanation + hypotheses[0].suggestion).lower()
    assert not support.kinds(twin) & LOSS_KINDS, twin.report()


def test_a_loss_still_falling_tenfold_in_its_second_half_is_not_stopped():
    """Judged against the second half's own noise: the whole run's, dominated by its first steps, would call it
    stopped and, with updates of 0.1 of the weights, unstable."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.08)
    with NeuralDbg(model) as dbg:
        losses = loop(model, support.regression_batches(), 160, opt, opt.zero_grad, loss_fn=F.mse_loss)
    torch.manual_seed(0)
    slower = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    slower_losses = support.plain_train(
        slower, support.regression_batches(), steps=160, optimizer=torch.optim.SGD(slower.parameters(), lr=0.05)
    )
    # plain torch: it learns better than its twin at a lower learning rate, and still falls in its second half
    assert sum(losses[-40:]) < sum(slower_losses[-40:])
    assert sum(losses[80:107]) / 27 > 1.5 * sum(losses[-27:]) / 27
    assert not support.kinds(dbg) & LOSS_KINDS, dbg.report()


def test_a_loss_summed_over_episodes_of_growing_length_is_not_judged():
    """An actor-critic's loss: a sum over an episode, one forward pass per time step, episodes longer as the policy
    improves. The sum climbs while the loss per time step falls: the loss follows the episode, not only the model."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    make = support.regression_batches(batch=1)
    sums, means = [], []
    with NeuralDbg(model) as dbg:
        for episode in range(100):
            opt.zero_grad()
            length = 3 + episode + episode % 3  # longer episodes as training goes on
            losses = [F.mse_loss(model(x), y) for x, y in (make(1000 * episode + t) for t in range(length))]
            loss = torch.stack(losses).sum()
            loss.backward()
            opt.step()
            sums.append(loss.item())
            means.append(loss.item() / length)
    # plain torch: the sum climbs, the loss per time step falls
    assert sum(sums[-25:]) > 1.5 * sum(sums[:12]) * 25 / 12
    assert sum(means[-25:]) / 25 < 0.75 * sum(means[:12]) / 12
    assert not support.kinds(dbg) & LOSS_KINDS, dbg.report()


def noisy_regression(learnable: bool, steps: int) -> tuple[NeuralDbg, list[float], float, float]:
    """A linear regression whose batches differ in their noise level (sigma drawn from 0-3 per batch of 16, as a
    meta-learner's tasks differ in amplitude): the loss spreads from batch to batch by more than its level. Its
    targets follow the inputs (``learnable``) or not. Also the error against the noise-free targets on held-out
    inputs before and after (plain torch)."""
    torch.manual_seed(0)
    w = torch.randn(10, 1) * math.sqrt(2 / 10)  # the learnable part: a variance of about 2
    model = nn.Linear(10, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    held = torch.randn(1000, 10)

    def clean_error() -> float:
        with torch.no_grad():
            return float(F.mse_loss(model(held), held @ w))

    before = clean_error()
    losses: list[float] = []
    with NeuralDbg(model) as dbg:
        for _ in range(steps):
            x = torch.randn(16, 10)
            sigma = torch.empty(1).uniform_(0, 3)
            signal = x @ w if learnable else torch.randn(16, 10) @ w
            loss = F.mse_loss(model(x), signal + sigma * torch.randn(16, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return dbg, losses, before, clean_error()


def test_a_loss_whose_batches_spread_by_more_than_its_fall_is_not_called_flat_while_the_model_learns():
    dbg, losses, before, after = noisy_regression(learnable=True, steps=300)
    # plain torch: the model learns all it can (its error against the noise-free targets falls a hundredfold), the
    # loss falls by a fifth or more, and by less than its batch-to-batch spread
    assert after < 0.02 * before
    first, last = sum(losses[:37]) / 37, sum(losses[-75:]) / 75
    spread = math.sqrt(sum((a - b) ** 2 for a, b in itertools.pairwise(losses)) / (2 * (len(losses) - 1)))
    assert 0.2 * first < first - last < spread
    assert FailureKind.LOSS_NOT_DECREASING not in {h.kind for h in dbg.hypotheses()}, dbg.explain_failure()


def test_the_same_loss_with_nothing_to_learn_is_flat_over_a_longer_run():
    dbg, losses, _, _ = noisy_regression(learnable=False, steps=1000)
    # plain torch: the targets do not follow the inputs: the loss stays where it began
    assert abs(sum(losses[-250:]) / 250 - sum(losses[:125]) / 125) < 0.1 * sum(losses[:125]) / 125
    assert FailureKind.LOSS_NOT_DECREASING in {h.kind for h in dbg.hypotheses()}, dbg.explain_failure()
