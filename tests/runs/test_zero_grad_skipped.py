"""How many carried-over steps make ``gradients_not_zeroed``: one skipped ``zero_grad()`` (a loop's odd iteration)
is tolerated, two are reported, dated from the first. Pins ``MIN_STEPS`` of the room: setting it to 1 passed every
test before this file (found by a mutation pass over the rooms).

Ground truth by plain torch: at the start of each backward pass, whether the first layer's ``.grad`` is still the
gradient the optimizer applied at the previous step."""

from __future__ import annotations

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 30


@pytest.mark.parametrize(("skipped", "reported"), [((), False), ((12,), False), ((12, 20), True)])
def test_one_skipped_zero_grad_is_tolerated_and_two_are_reported(skipped: tuple[int, ...], reported: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    make = support.classification_batches((32,), 10, batch=64)
    carried = []
    with NeuralDbg(model) as dbg:
        applied = None
        for step in range(STEPS):
            x, y = make(step)
            if step not in skipped:
                opt.zero_grad()
            before = model[0].weight.grad
            carried.append(before is not None and applied is not None and torch.equal(before, applied))
            F.cross_entropy(model(x), y).backward()
            applied = model[0].weight.grad.clone()
            opt.step()
    assert [step for step, c in enumerate(carried) if c] == list(skipped)  # the ground truth, in plain torch
    found = [h for h in dbg.hypotheses() if h.kind is FailureKind.GRADIENTS_NOT_ZEROED]
    assert bool(found) is reported, dbg.report()
    if reported:
        assert found[0].root.step_start == skipped[0]


@pytest.mark.parametrize("forgotten", ["body", "head", None])
def test_two_optimizers_one_without_zero_grad_is_found_beside_the_one_that_has_it(forgotten: str | None) -> None:
    """A body and a head, each with its own Adam; ``zero_grad`` is called on one of them only (the other's
    gradients add up step after step, while the first's are fresh each step). Plain torch: the forgotten side's
    ``.grad`` at the start of each backward pass is the gradient its optimizer applied. Found for either side,
    whatever the loss does (here, under Adam, the body's summed gradients even fit these 120 steps faster); the twin
    that zeroes both is silent."""
    make = support.classification_batches((32,), 10, batch=64)

    def run(forgotten: str | None) -> tuple[list[float], list[bool], NeuralDbg]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        body, head = list(model[0].parameters()), list(model[2].parameters())
        opts = {"body": torch.optim.Adam(body, lr=1e-3), "head": torch.optim.Adam(head, lr=1e-3)}
        side = {"body": model[0].weight, "head": model[2].weight}
        losses, carried = [], []
        applied = None
        with NeuralDbg(model) as dbg:
            for step in range(120):
                x, y = make(step)
                if forgotten is not None:
                    before = side[forgotten].grad
                    carried.append(before is not None and applied is not None and torch.equal(before, applied))
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                for opt in opts.values():
                    opt.step()
                if forgotten is not None:
                    applied = side[forgotten].grad.clone()
                for name, opt in opts.items():
                    if name != forgotten:
                        opt.zero_grad()
                losses.append(float(loss.detach()))
        return losses, carried, dbg

    _, carried, dbg = run(forgotten)
    found = [h for h in dbg.hypotheses() if h.kind is FailureKind.GRADIENTS_NOT_ZEROED]
    if forgotten is None:
        assert not found, dbg.explain_failure()
        return
    assert all(carried[1:])  # plain torch: from step 1 on, the forgotten side still held the applied gradient
    assert found and found[0].root.step_start == 1, dbg.explain_failure()
    named = "'0.weight'" if forgotten == "body" else "'2.weight'"
    assert named in found[0].explanation


def test_a_gan_watched_whole_whose_generator_loss_passes_through_the_stepped_discriminator_is_not_flagged() -> None:
    """One module holding a generator and a discriminator, two Adams, alternating steps: the generator's loss
    backpropagates through the discriminator after the discriminator stepped, so it adds onto the gradients the
    discriminator's optimizer just applied. Plain torch: that carry-over is real, but the discriminator's
    ``zero_grad`` resets it before its optimizer steps again, so every discriminator step applies its own loss's
    gradient alone. Not the fault (it was, when a carry-over was filed at the generator's step)."""
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    disc = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    model = nn.ModuleDict({"gen": gen, "disc": disc})
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-3, betas=(0.5, 0.999))
    carried_into_g, own_gradient_at_d_step = [], []
    with NeuralDbg(model) as dbg:
        for step in range(60):
            g = torch.Generator().manual_seed(step)
            z, real = torch.randn(64, 4, generator=g), torch.randn(64, 2, generator=g) * 0.5 + 2.0
            fake = gen(z)
            opt_d.zero_grad()
            d_loss = F.binary_cross_entropy_with_logits(disc(real), torch.ones(64, 1))
            d_loss = d_loss + F.binary_cross_entropy_with_logits(disc(fake.detach()), torch.zeros(64, 1))
            own = torch.autograd.grad(d_loss, disc[0].weight, retain_graph=True)[0]
            d_loss.backward()
            own_gradient_at_d_step.append(torch.equal(disc[0].weight.grad, own))
            opt_d.step()
            applied = disc[0].weight.grad.clone()
            opt_g.zero_grad()
            g_loss = F.binary_cross_entropy_with_logits(disc(fake), torch.ones(64, 1))
            carried_into_g.append(torch.equal(disc[0].weight.grad, applied))
            g_loss.backward()
            opt_g.step()
    assert all(carried_into_g) and all(own_gradient_at_d_step)  # plain torch: carried, yet never applied
    assert not [h for h in dbg.hypotheses() if h.kind is FailureKind.GRADIENTS_NOT_ZEROED], dbg.explain_failure()


def test_under_a_grad_scaler_the_leftover_is_divided_by_the_scale_and_the_explanation_says_so() -> None:
    """``zero_grad`` forgotten under a GradScaler: ``scaler.step`` unscales ``.grad`` in place, so the next backward
    pass adds the scaled new gradient to the unscaled leftover, and the next unscale divides the leftover by the
    scale once more. Plain torch: the gradient the optimizer gets is the fresh one plus the leftover / scale. Still
    found (the loop is wrong), explained in those terms rather than as a sum growing with the steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    make = support.classification_batches((32,), 10, batch=64)
    matched = []
    with NeuralDbg(model) as dbg:
        for step in range(30):
            x, y = make(step)
            leftover = None if model[0].weight.grad is None else model[0].weight.grad.clone()
            fresh = torch.autograd.grad(F.cross_entropy(model(x), y), model[0].weight)[0]
            scaler.scale(F.cross_entropy(model(x), y)).backward()
            scaler.unscale_(opt)
            if leftover is not None:
                expected = fresh + leftover / scaler.get_scale()
                matched.append(torch.allclose(model[0].weight.grad, expected, rtol=1e-4, atol=1e-7))
            scaler.step(opt)
            scaler.update()
    assert matched and all(matched)  # plain torch: the leftover comes back divided by the scale
    found = [h for h in dbg.hypotheses() if h.kind is FailureKind.GRADIENTS_NOT_ZEROED]
    assert found, dbg.explain_failure()
    assert "1/scale of itself" in found[0].explanation and "grows with the number of steps" not in found[0].explanation
