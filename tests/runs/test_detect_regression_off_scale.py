"""A regression whose predictions stay far off its targets' scale: its mean squared error ends at 30 times the
targets' variance or more, worse than predicting their mean (``loss_at_chance`` with the metric ``far_above``).
Targets left unstandardised (a quantity around 5 that varies by 0.08) or weights initialised far too large put
the outputs far from the targets at the start, and steps of the learning rate's size bring them there slowly.
Ground truth is plain torch in each test: the held-out error against the targets' variance, and the same program
with its targets standardised."""

from __future__ import annotations

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind
from neuraldbg.kinds import loss_evidence
from neuraldbg.text import num

STEPS = 300


def batches(shift: float, scale: float):
    """Batches of 64 from a smooth function of 8 standard-normal inputs, scaled by ``scale`` around ``shift``."""

    def draw(step: int) -> support.Batch:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(64, 8, generator=g)
        y = torch.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]
        return x, y * scale + shift

    return draw


def fit(shift: float, scale: float, init_std: float | None = None, steps: int = STEPS, watched: bool = True):
    """An MLP regression under Adam 1e-3: the losses, the debugger, and the held-out error over the targets'
    variance (plain torch: 1 is predicting their mean)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    if init_std is not None:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0, init_std)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    draw = batches(shift, scale)
    losses, dbg = support.fit(model, draw, F.mse_loss, steps, opt, watched)
    x, y = draw(10_000)
    with torch.no_grad():
        relative = float(F.mse_loss(model(x), y) / y.var())
    return losses, dbg, relative


def test_unstandardised_targets_leave_the_error_far_above_their_variance_and_are_found():
    plain, _, relative = fit(shift=5.0, scale=0.1, watched=False)
    _, _, standardised = fit(shift=0.0, scale=1.0, watched=False)
    # plain torch: after 300 steps the predictions are worse than predicting the targets' mean, by far; the same
    # targets standardised are fitted
    assert relative > 20 and standardised < 0.3
    losses, dbg, _ = fit(shift=5.0, scale=0.1)
    assert losses == plain and dbg is not None
    found = dbg.hypotheses()
    assert found and found[0].kind is FailureKind.LOSS_AT_CHANCE, dbg.report()
    m = found[0].root.metrics
    assert m["far_above"] >= loss_evidence.FAR_ABOVE and m["start"] > 100 * m["target_level"]
    assert "far above the targets' variance" in found[0].explanation
    assert "outputs and targets on different scales" in found[0].explanation
    assert found[0].suggestion.startswith("standardise the targets")


def test_weights_far_too_large_name_the_loss_off_scale_among_their_effects():
    plain, _, relative = fit(shift=0.0, scale=1.0, init_std=10.0, watched=False)
    assert relative > 1e6  # plain torch: outputs of the order of 1e4 against targets of unit scale
    losses, dbg, _ = fit(shift=0.0, scale=1.0, init_std=10.0)
    assert losses == plain and dbg is not None
    found = dbg.hypotheses()
    assert found, dbg.report()
    assert "a loss far above its targets' variance" in found[0].explanation, dbg.report()


def test_standardised_targets_are_silent_however_short_the_run():
    for steps in (64, STEPS):
        _, dbg, relative = fit(shift=0.0, scale=1.0, steps=steps)
        assert relative < 1.0  # plain torch: better than predicting the mean
        assert dbg is not None and dbg.healthy, dbg.report()


def test_targets_of_a_large_scale_that_the_fit_reaches_are_not_off_scale():
    """Targets 100 times larger, centred: the error ends under their variance (plain torch), nothing said of it."""
    _, dbg, relative = fit(shift=0.0, scale=100.0)
    assert relative < 1.0
    assert dbg is not None and "far_above" not in {k for h in dbg.hypotheses() for k in h.root.metrics}


def test_the_ratio_is_told_against_the_level_it_was_taken_from():
    """Two target columns of small spread around 8 and 9: the variance of all the targets (their means apart) is far
    above each column's, the finding's ratio is to the former, and the words name that one."""

    def draw(step: int) -> support.Batch:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(64, 8, generator=g)
        a, b = torch.sin(x[:, :1]), 0.5 * x[:, 1:2] * x[:, 2:3]
        return x, torch.cat([0.1 * a + 8.0, 0.1 * b + 9.0], 1)

    _, y = draw(10_000)
    assert y.var() > 20 * y.var(0).mean()  # plain torch: the pooled variance is the larger level, by far
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    _, dbg = support.fit(model, draw, F.mse_loss, STEPS, torch.optim.Adam(model.parameters(), lr=1e-4), True)
    assert dbg is not None
    found = dbg.hypotheses()
    assert found and "far_above" in found[0].root.metrics, dbg.report()
    m = found[0].root.metrics
    assert m["target_pooled"] > m["target_level"]
    assert m["far_above"] * m["target_pooled"] == pytest.approx(m["end"])
    assert f"times {num(m['target_pooled'])}, the variance of all the targets" in found[0].explanation


def test_gradients_exploding_on_targets_in_the_thousands_are_told_to_standardise_the_targets_first():
    """Targets around 5,000 that vary by 1,000: the loss's gradients grow with them and explode; the fix is their
    scale, before any learning rate (plain torch: the same targets standardised are fitted)."""
    plain, _, relative = fit(shift=5000.0, scale=1000.0, watched=False)
    _, _, standardised = fit(shift=0.0, scale=1.0, watched=False)
    _, y = batches(5000.0, 1000.0)(0)
    assert relative > 1.0 and standardised < 0.3 and float(y.pow(2).mean().sqrt()) > 1000
    losses, dbg, _ = fit(shift=5000.0, scale=1000.0)
    assert losses == plain and dbg is not None
    found = dbg.hypotheses()
    assert found and found[0].kind is FailureKind.EXPLODING_GRADIENTS, dbg.report()
    assert "regression targets' root-mean-square is" in found[0].explanation
    assert found[0].suggestion.startswith("standardise the regression targets"), found[0].suggestion
    assert "then, if gradients still explode, lower the learning rate" in found[0].suggestion
