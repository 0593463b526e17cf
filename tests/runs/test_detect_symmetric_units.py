"""Identical units: a layer whose units all start with the same weights (a constant initialisation) and that
training does not tell apart. Ground truth is plain torch in each test: the same program with PyTorch's default
initialisation reaches a clearly better held-out accuracy, and the constant layer's rows are still near-copies
at the end (their spread ``||W - mean row|| / ||W||`` far below the default's ~1). The healthy twins stay
silent: the default initialisation, a zero-initialised head (its units part at the first update), a fixed
averaging filter nobody trains, and a zero head whose two outputs are the same target."""

from __future__ import annotations

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.capture import symmetry

KIND = "symmetric_units"
CLASSES = 4
STEPS = 120
make = support.classification_batches((16,), CLASSES, batch=64, seed=4)


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def constant(model: nn.Module, value: float = 0.05) -> nn.Module:
    """What the fault does: every weight matrix set to one value (the biases keep their random start)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.fill_(value)
    return model


def spread(weight: torch.Tensor) -> float:
    rows = weight.detach().reshape(weight.shape[0], -1).double()
    return float((rows - rows.mean(0)).norm() / rows.norm())


def accuracy(model: nn.Module) -> float:
    model.eval()
    with torch.no_grad():
        held = [make(10_000 + i) for i in range(4)]
        return sum(float((model(x).argmax(1) == y).float().mean()) for x, y in held) / len(held)


def run(build, watched: bool, steps: int = STEPS, batches=make, loss_fn=F.cross_entropy):
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses, dbg = support.fit(model, batches, loss_fn, steps, opt, watched)
    return model, losses, dbg


def kinds(dbg: NeuralDbg | None) -> list[str]:
    assert dbg is not None
    return [h.kind.value for h in dbg.hypotheses()]


def test_a_constant_initialisation_is_found_and_the_default_one_is_silent():
    faulty, losses, _ = run(lambda: constant(mlp()), watched=False)
    healthy, _, _ = run(mlp, watched=False)
    # plain torch: the constant start trains far worse, and its hidden units are still near-copies of each other
    assert accuracy(faulty) < accuracy(healthy) - 0.1
    assert spread(faulty[0].weight) < 0.5 and spread(faulty[2].weight) < 0.5
    assert spread(healthy[0].weight) > 0.9

    _, watched, dbg = run(lambda: constant(mlp()), watched=True)
    assert watched == losses  # the debugger changes nothing
    assert kinds(dbg)[:1] == [KIND], dbg and dbg.explain_failure()
    found = dbg.hypotheses()[0]
    assert found.root.detail == "0, 2" and found.root.metrics["units"] == 64
    assert 0 < found.root.metrics["spread"] < 0.5
    assert "'0', '2' started with the same weights" in found.explanation
    assert "initialise the weights randomly" in found.suggestion

    _, _, twin = run(mlp, watched=True)
    assert twin is not None and twin.healthy, twin.explain_failure()


def test_filters_that_batch_norm_keeps_exact_copies_are_found():
    def net() -> nn.Sequential:
        model = constant(
            nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1),
                nn.BatchNorm2d(8),
                nn.ReLU(),
                nn.Conv2d(8, 8, 3, padding=1),
                nn.BatchNorm2d(8),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(8, CLASSES),
            )
        )
        return model

    images = support.classification_batches((3, 6, 6), CLASSES, batch=32, seed=2)
    model, losses, _ = run(net, watched=False, steps=40, batches=images)
    # plain torch: batch norm takes out what the filters share, so their gradient is the same for each: exact copies
    assert spread(model[0].weight) < 1e-6 and spread(model[3].weight) < 1e-6

    _, watched, dbg = run(net, watched=True, steps=40, batches=images)
    assert watched == losses
    assert kinds(dbg)[:1] == [KIND], dbg and dbg.explain_failure()
    assert {"0", "3"} <= set(dbg.hypotheses()[0].root.detail.split(", "))
    held = dbg._recorder.coverage.symmetric
    assert held["0"][4] < 1e-5 and held["3"][4] < 1e-5  # read as the exact copies they are


def test_a_zero_initialised_head_parts_at_once_and_is_silent():
    def zero_head() -> nn.Sequential:
        model = mlp()
        nn.init.zeros_(model[4].weight)
        return model

    model, _, _ = run(zero_head, watched=False)
    assert spread(model[4].weight) > 0.9  # plain torch: its units got different errors and parted
    _, _, dbg = run(zero_head, watched=True)
    assert dbg is not None and dbg.healthy, dbg.explain_failure()


def test_a_zero_head_whose_outputs_are_one_target_twice_is_not_a_candidate():
    # a regression of two copies of one target: the head's rows stay equal because the task makes them so
    def twin_outputs(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(64, 16, generator=g)
        y = x[:, :1] - 0.5 * x[:, 1:2]
        return x, torch.cat([y, y], dim=1)

    def regressor() -> nn.Sequential:
        model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 2))
        nn.init.zeros_(model[2].weight)
        return model

    model, losses, _ = run(regressor, watched=False, batches=twin_outputs, loss_fn=F.mse_loss)
    assert spread(model[2].weight) < 0.1 and losses[-1] < 0.2 * losses[0]  # plain torch: near-copies, and it learns
    _, _, dbg = run(regressor, watched=True, batches=twin_outputs, loss_fn=F.mse_loss)
    assert KIND not in kinds(dbg), dbg and dbg.explain_failure()


def test_a_fixed_averaging_filter_is_not_trained_and_not_reported():
    class Blurred(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blur = nn.Conv2d(3, 3, 3, padding=1, bias=False)
            nn.init.constant_(self.blur.weight, 1 / 27)  # every output channel the mean of a 3x3x3 patch
            self.blur.weight.requires_grad_(False)
            self.body = nn.Sequential(nn.Flatten(), nn.Linear(3 * 6 * 6, 32), nn.ReLU(), nn.Linear(32, CLASSES))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(self.blur(x))

    images = support.classification_batches((3, 6, 6), CLASSES, batch=32, seed=2)
    _, _, dbg = run(Blurred, watched=True, steps=40, batches=images)
    assert KIND not in kinds(dbg), dbg and dbg.explain_failure()

    # the same filter left trainable in a parameter group at learning rate 0: it gets a gradient, never moves
    torch.manual_seed(0)
    model = Blurred()
    model.blur.weight.requires_grad_(True)
    opt = torch.optim.SGD(
        [{"params": model.body.parameters()}, {"params": model.blur.parameters(), "lr": 0.0}], lr=0.1, momentum=0.9
    )
    dbg, _ = support.train(model, images, F.cross_entropy, steps=40, optimizer=opt)
    assert torch.all(model.blur.weight == 1 / 27)  # plain torch: untouched
    assert KIND not in kinds(dbg), dbg.explain_failure()


def test_one_check_is_not_enough():
    from neuraldbg.capture.coverage import Coverage, RunFacts
    from neuraldbg.kinds.symmetric_units import SymmetricUnits

    room, facts = SymmetricUnits(), RunFacts(trainable=1, backward_passes=1, optimizer_steps=1)
    coverage = Coverage()
    coverage._symmetric(0, {"fc": (8, 0.0)})
    assert room.run_finding(coverage, facts) is None
    coverage._symmetric(16, {"fc": (8, 0.1)})
    found = room.run_finding(coverage, facts)
    assert found is not None and (found.step_start, found.step_end, found.metrics["checks"]) == (0, 16, 2)
    coverage._symmetric(32, {})  # the units parted: nothing left to report
    assert room.run_finding(coverage, facts) is None


class Factorisation(nn.Module):
    """A recommender: a user's and an item's vectors, their dot product a rating."""

    def __init__(self, start: float | None) -> None:
        super().__init__()
        self.users, self.items = nn.Embedding(50, 8), nn.Embedding(40, 8)
        if start is not None:
            nn.init.constant_(self.users.weight, start)
            nn.init.constant_(self.items.weight, start)

    def forward(self, pairs: torch.Tensor) -> torch.Tensor:
        return (self.users(pairs[:, 0]) * self.items(pairs[:, 1])).sum(1)


def ratings(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ratings from a rank-3 truth."""
    truth = torch.Generator().manual_seed(77)
    u, v = torch.randn(50, 3, generator=truth), torch.randn(40, 3, generator=truth)
    g = torch.Generator().manual_seed(step)
    pairs = torch.stack([torch.randint(0, 50, (128,), generator=g), torch.randint(0, 40, (128,), generator=g)], 1)
    return pairs, (u[pairs[:, 0]] * v[pairs[:, 1]]).sum(1)


def test_an_embedding_whose_dimensions_start_alike_is_found():
    def fit(start: float | None, watched: bool):
        torch.manual_seed(0)
        model = Factorisation(start)
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        if watched:
            return model, *support.train(model, ratings, F.mse_loss, steps=200, optimizer=opt)
        return model, None, support.plain_train(model, ratings, F.mse_loss, steps=200, optimizer=opt)

    constant, _, losses = fit(0.05, watched=False)
    _, _, healthy = fit(None, watched=False)
    # plain torch: every vector stays c x (1, ..., 1), a one-dimensional factorisation, and fits far worse
    assert spread(constant.users.weight.t()) < 1e-6 and spread(constant.items.weight.t()) < 1e-6
    assert sum(losses[-20:]) > 2 * sum(healthy[-20:])

    _, dbg, watched = fit(0.05, watched=True)
    assert watched == losses
    assert kinds(dbg)[:1] == [KIND], dbg.explain_failure()
    assert dbg.hypotheses()[0].root.detail == "users, items"
    _, twin, _ = fit(None, watched=True)
    assert KIND not in kinds(twin), twin.explain_failure()


def test_dropout_parts_a_constant_start_only_partly():
    """Dropout's masks tell the units apart, slowly: the constant layers' spread stays well below a random start's
    while the fit stays far below the default start's (plain torch); still found."""

    def dropped() -> nn.Sequential:
        return nn.Sequential(
            nn.Linear(16, 64),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(64, 64),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(64, CLASSES),
        )

    faulty, _, _ = run(lambda: constant(dropped()), watched=False)
    healthy, _, _ = run(dropped, watched=False)
    assert accuracy(faulty) < accuracy(healthy) - 0.1
    assert 0.05 < spread(faulty[0].weight) < 0.8  # parted somewhat, not as a random start (about 1)
    _, _, dbg = run(lambda: constant(dropped()), watched=True)
    assert kinds(dbg)[:1] == [KIND], dbg.explain_failure()


def test_a_with_block_per_epoch_attaches_again_and_still_reads_the_units():
    """Re-attaching (a ``with dbg:`` block per epoch) skips the weights already seen distinct and keeps following
    the constant ones: the constant MLP is still found, its default twin still silent, and no attach fails."""

    def epochs(build) -> NeuralDbg:
        torch.manual_seed(0)
        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        dbg = NeuralDbg(model)
        for epoch in range(3):
            with dbg:
                for step in range(epoch * 40, epoch * 40 + 40):
                    x, y = make(step)
                    opt.zero_grad()
                    F.cross_entropy(model(x), y).backward()
                    opt.step()
        return dbg

    assert kinds(epochs(lambda: constant(mlp())))[:1] == [KIND]
    healthy = epochs(mlp)
    assert healthy.healthy and not healthy._recorder.coverage.failures, healthy.explain_failure()


# --- every layer zeroed: units that move along one direction ----------------------------------------------------


def zeroed(model: nn.Module) -> nn.Module:
    """What the fault does: every weight matrix zeroed (``nn.init.zeros_`` in an init loop); biases keep their start."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.zero_()
    return model


def off_direction(weight: torch.Tensor) -> float:
    """The share of the weight's energy outside its top singular direction: 0 when every row is a multiple of one."""
    s = torch.linalg.svdvals(weight.detach().reshape(weight.shape[0], -1).double())
    return float(1 - s[0] ** 2 / (s**2).sum())


def adam_run(build, watched: bool):
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses, dbg = support.fit(model, make, F.cross_entropy, STEPS, opt, watched)
    return model, losses, dbg


@pytest.mark.parametrize("runner", [run, adam_run], ids=["sgd", "adam"])
def test_every_layer_zeroed_moves_each_layers_units_as_one_and_is_found(runner):
    faulty, losses, _ = runner(lambda: zeroed(mlp()), watched=False)
    healthy, _, _ = runner(mlp, watched=False)
    # plain torch: the zeroed net trains far worse, and each layer's rows are still multiples of one row (they are
    # no copies: the row spread the constant start is read by says nothing here)
    assert accuracy(faulty) < accuracy(healthy) - 0.3
    assert off_direction(faulty[2].weight) < 0.01 and off_direction(faulty[4].weight) < 0.01
    assert spread(faulty[2].weight) > 0.5
    assert off_direction(healthy[2].weight) > 0.5

    _, watched, dbg = runner(lambda: zeroed(mlp()), watched=True)
    assert watched == losses
    assert kinds(dbg)[:1] == [KIND], dbg and dbg.explain_failure()
    found = dbg.hypotheses()[0]
    assert {"2", "4"} <= set(found.root.detail.split(", ")) and found.root.metrics["zero_started"] == 1.0
    assert found.root.metrics["spread"] < symmetry.ONE_DIRECTION
    assert "Units moving as one" in found.explanation and "a multiple of one row" in found.explanation
    assert "instead of zeroing every layer" in found.suggestion
    _, _, twin = runner(mlp, watched=True)
    assert twin is not None and twin.healthy, twin.explain_failure()


class ZeroBranches(nn.Module):
    """A residual MLP whose branches' last layers start at zero (each block an identity at first): three zero weights,
    each given a varying input and a varying error."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 64)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)) for _ in range(3)])
        self.out = nn.Linear(64, CLASSES)
        for block in self.blocks:
            nn.init.zeros_(block[2].weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(F.relu(h))


class ZeroAdapters(nn.Module):
    """Two layers with rank-4 adapters whose up-projections start at zero, and two zero heads side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(16, 64), nn.Linear(64, CLASSES)
        self.down1, self.up1 = nn.Linear(16, 4, bias=False), nn.Linear(4, 64, bias=False)
        self.down2, self.up2 = nn.Linear(64, 4, bias=False), nn.Linear(4, CLASSES, bias=False)
        self.side = nn.Linear(64, CLASSES)
        for layer in (self.up1, self.up2, self.side):
            nn.init.zeros_(layer.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.l1(x) + self.up1(self.down1(x)))
        return self.l2(h) + self.up2(self.down2(h)) + 0.5 * self.side(h)


@pytest.mark.parametrize("build", [ZeroBranches, ZeroAdapters], ids=["residual_branches", "adapters_and_heads"])
@pytest.mark.parametrize("runner", [run, adam_run], ids=["sgd", "adam"])
def test_zero_starts_whose_units_get_varying_errors_part_and_are_silent(build, runner):
    model, _, _ = runner(build, watched=False)
    assert accuracy(model) > 0.85  # plain torch: they train as well as a default start
    started = [b[2] for b in model.blocks] if isinstance(model, ZeroBranches) else [model.up1, model.up2, model.side]
    # ... and no zero layer's units kept to one row (a 4-class head's rows sum to zero: 3 directions at most)
    assert min(off_direction(layer.weight) for layer in started) > 0.25
    _, _, dbg = runner(build, watched=True)
    assert dbg is not None and KIND not in kinds(dbg), dbg.explain_failure()
