"""``optimizer.step()`` indented out of the batch loop (sweep M, F1): ``zero_grad()`` and ``backward()`` run every
batch, the step once per epoch, so every batch's gradient but the epoch's last is reset before any step uses it.
The debugger said "healthy - no training failure in 10 observed steps" (too few steps to judge the loss); it is
``discarded_gradients``, with the passes and steps counted and the step moved back into the loop as the fix.

Ground truth by plain torch: the loop's own count of the backward passes whose gradient a ``zero_grad()`` reset
before any step, the steps taken, and held-out accuracy against the twin that steps every batch. The healthy
schemes that also run more backward passes than steps, or reset gradients between passes, stay silent:
accumulation (no reset between the passes), a validation that calls ``backward()`` every epoch, sharpness-aware
minimisation (two passes a step, the first one's gradient used to perturb the weights), two optimizers over two
parameter groups, and a GAN's discriminator, whose gradients the generator's backward pass also writes until the
discriminator's next ``zero_grad()`` (one pass in two thrown away)."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind
from neuraldbg.capture.coverage import Coverage, RunFacts
from neuraldbg.kinds import discarded_gradients

EPOCHS, BATCHES, BATCH = 8, 16, 32
KIND = FailureKind.DISCARDED_GRADIENTS.value


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g0 = torch.Generator().manual_seed(1234)
    w1, w2 = torch.randn(20, 32, generator=g0), torch.randn(32, 4, generator=g0)
    x = torch.randn(n, 20, generator=torch.Generator().manual_seed(seed))
    return x, (torch.tanh(x @ w1 / 20**0.5 * 2) @ w2).argmax(1)


def run(scheme: str, watched: bool) -> dict:
    """``scheme``: "per_epoch" (the bug), "per_batch", "accumulated", "validation", "sam" or "two_optimizers"."""
    torch.manual_seed(0)
    x, y = _data(BATCHES * BATCH, 1)
    xv, yv = _data(4 * BATCH, 2)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    params = list(model.parameters())
    opts = [torch.optim.Adam(params, lr=3e-3)]
    if scheme == "two_optimizers":
        opts = [torch.optim.Adam(model[0].parameters(), lr=3e-3), torch.optim.Adam(model[2].parameters(), lr=3e-3)]
    out = {"steps": 0, "passes": 0, "discarded": 0}
    unused = [False]  # a backward pass left a gradient that no step has used yet

    def zero() -> None:
        out["discarded"] += unused[0] and any(p.grad is not None for p in params)
        unused[0] = False
        for opt in opts:
            opt.zero_grad()

    def backward(loss: torch.Tensor) -> None:
        loss.backward()
        out["passes"] += 1
        unused[0] = True

    def step() -> None:
        for opt in opts:
            opt.step()
        out["steps"] += 1
        unused[0] = False

    def loop() -> None:
        g = torch.Generator().manual_seed(100)
        for _ in range(EPOCHS):
            perm = torch.randperm(BATCHES * BATCH, generator=g)
            for b in range(BATCHES):
                i = perm[b * BATCH : (b + 1) * BATCH]
                if scheme != "accumulated" or b % 4 == 0:
                    zero()
                backward(F.cross_entropy(model(x[i]), y[i]))
                if scheme == "sam":  # the first pass's gradient sets the perturbation; the second's is applied
                    with torch.no_grad():
                        norm = torch.sqrt(sum((p.grad**2).sum() for p in params))
                        eps = [0.05 * p.grad / norm for p in params]
                        for p, e in zip(params, eps, strict=True):
                            p.add_(e)
                    zero()
                    backward(F.cross_entropy(model(x[i]), y[i]))
                    with torch.no_grad():
                        for p, e in zip(params, eps, strict=True):
                            p.sub_(e)
                if scheme == "per_epoch" or (scheme == "accumulated" and b % 4 != 3):
                    continue
                step()
            if scheme == "per_epoch":
                step()  # dedented one level too far
            if scheme == "validation":  # a gradient norm on held-out batches, for a log
                for v in range(4):
                    zero()
                    backward(F.cross_entropy(model(xv[v * BATCH : (v + 1) * BATCH]), yv[v * BATCH : (v + 1) * BATCH]))

    out["dbg"] = support.watching(model, loop, watched)
    xt, yt = _data(1024, 999)
    with torch.no_grad():
        out["accuracy"] = (model(xt).argmax(1) == yt).float().mean().item()
    return out


def test_ground_truth_a_step_once_an_epoch_throws_away_all_but_one_gradient_an_epoch_and_learns_less() -> None:
    fault, twin = run("per_epoch", watched=False), run("per_batch", watched=False)
    assert fault["steps"] == EPOCHS and fault["passes"] == EPOCHS * BATCHES
    assert fault["discarded"] == EPOCHS * (BATCHES - 1)  # every pass but the last of each epoch
    assert twin["discarded"] == 0 and twin["steps"] == EPOCHS * BATCHES
    assert fault["accuracy"] < twin["accuracy"] - 0.15, (fault["accuracy"], twin["accuracy"])


def test_a_step_once_an_epoch_is_discarded_gradients_with_its_counts_and_the_step_moved_into_the_loop() -> None:
    out = run("per_epoch", watched=True)
    assert out["accuracy"] == run("per_epoch", watched=False)["accuracy"]  # the run is unchanged
    dbg = out["dbg"]
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.DISCARDED_GRADIENTS
    text = dbg.explain_failure()[0]
    # the first epoch's passes come before the first step, when no optimizer is known yet: not counted
    counted = (EPOCHS - 1) * BATCHES
    assert f"{(EPOCHS - 1) * (BATCHES - 1)} of the {counted} backward passes" in text
    assert f"{EPOCHS} optimizer steps" in text and "about 1 in 16" in text
    assert "call optimizer.step() once per batch, inside the batch loop, right after loss.backward()" in text
    assert "zero_grad() only after optimizer.step()" in text


def test_accumulation_validation_backward_sam_and_two_optimizers_are_silent() -> None:
    for scheme in ("per_batch", "accumulated", "validation", "sam", "two_optimizers"):
        plain = run(scheme, watched=False)
        assert plain["accuracy"] > 0.6, (scheme, plain["accuracy"])  # each trains
        out = run(scheme, watched=True)
        dbg = out["dbg"]
        assert KIND not in support.kinds(dbg), (scheme, dbg.explain_failure())
        coverage = dbg._recorder.coverage
        if scheme in ("validation", "sam"):  # gradients were thrown away, but not most, or not before most steps
            assert plain["discarded"] > 0 and coverage.discarded_backwards > 0, scheme


def _gan(watched: bool) -> tuple[dict, object]:
    """A small GAN on 2-d points; the discriminator is watched. The generator's backward pass goes through the
    discriminator and writes into its gradients, which the discriminator's next ``zero_grad()`` resets unused."""
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    netD = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optG = torch.optim.Adam(netG.parameters(), lr=1e-3, betas=(0.5, 0.999))
    optD = torch.optim.Adam(netD.parameters(), lr=1e-3, betas=(0.5, 0.999))
    g = torch.Generator().manual_seed(3)
    out = {"reset_unused": 0, "d_steps": 0, "start_gap": 0.0, "gap": 0.0}
    centre = torch.tensor([2.0, -1.0])

    def loop() -> None:
        for _ in range(300):
            real = centre + 0.3 * torch.randn(64, 2, generator=g)
            fake = netG(torch.randn(64, 4, generator=g))
            out["reset_unused"] += netD[0].weight.grad is not None  # the generator's pass, about to be reset
            optD.zero_grad()
            ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)
            errD = F.binary_cross_entropy_with_logits(netD(real), ones)
            errD = errD + F.binary_cross_entropy_with_logits(netD(fake.detach()), zeros)
            errD.backward()
            optD.step()
            out["d_steps"] += 1
            optG.zero_grad()
            F.binary_cross_entropy_with_logits(netD(fake), ones).backward()
            optG.step()

    with torch.no_grad():
        out["start_gap"] = float((netG(torch.randn(512, 4, generator=g)).mean(0) - centre).norm())
    dbg = support.watching(netD, loop, watched)
    with torch.no_grad():
        out["gap"] = float((netG(torch.randn(512, 4, generator=g)).mean(0) - centre).norm())
    return out, dbg


def test_a_gans_discriminator_throws_away_half_its_passes_and_is_silent() -> None:
    plain, _ = _gan(watched=False)
    assert plain["reset_unused"] == plain["d_steps"] - 1  # the generator's pass reset each iteration but the first
    assert plain["gap"] < 0.5 * plain["start_gap"], plain  # the generator moved towards the data
    _, dbg = _gan(watched=True)
    assert KIND not in support.kinds(dbg), dbg.explain_failure()  # type: ignore[union-attr]
    coverage = dbg._recorder.coverage  # type: ignore[union-attr]
    assert coverage.discarded_backwards >= 250
    assert coverage.discarded_backwards <= 0.51 * coverage.optimizer_backwards


def test_a_few_discarded_passes_a_minority_or_before_few_steps_are_not_a_finding() -> None:
    facts = RunFacts(trainable=10, backward_passes=100, optimizer_steps=10)
    kind = discarded_gradients.DiscardedGradients()

    def coverage(discarded: int, passes: int, intervals: int, discarding: int) -> Coverage:
        return Coverage(
            steps=10,
            last_step=9,
            discarded_backwards=discarded,
            optimizer_backwards=passes,
            step_intervals=intervals,
            discarding_intervals=discarding,
            first_discarded=1,
        )

    # too few; a half (a GAN); one stretch; an optimizer that never stepped (a GradScaler skipping every step:
    # loss_scale_collapse's) or stepped once
    for case in ((5, 5, 2, 2), (50, 100, 50, 50), (90, 100, 30, 2), (23, 23, 0, 0), (23, 24, 1, 1)):
        assert kind.run_finding(coverage(*case), facts) is None, case
    event = kind.run_finding(coverage(90, 100, 10, 9), facts)
    assert event is not None and event.step_start == 1
    assert "90 of the 100 backward passes" in kind.explain(event, [], None, {})[0]  # type: ignore[arg-type]


def _per_sample(watched: bool) -> tuple[float, object]:
    """DP-SGD written by hand: each sample's own backward pass, its gradient clipped into a buffer, ``zero_grad()``
    before the next sample; the noisy mean of the buffers assigned to ``.grad``, then one step per batch. Every
    pass but the batch's last is reset unused, as in the bug, but the script put the passes' gradients together
    itself. Held-out accuracy."""
    torch.manual_seed(0)
    x, y = _data(12 * 16, 1)
    xv, yv = _data(4 * BATCH, 2)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.5)

    def loop() -> None:
        for _ in range(4):
            for i in range(0, len(x), 16):
                buffers = [torch.zeros_like(p) for p in params]
                for j in range(i, i + 16):
                    opt.zero_grad()
                    F.cross_entropy(model(x[j : j + 1]), y[j : j + 1]).backward()
                    norm = float(torch.sqrt(sum((p.grad**2).sum() for p in params)))
                    for b, p in zip(buffers, params, strict=True):
                        b += p.grad * min(1.0, 1.0 / norm)
                for b, p in zip(buffers, params, strict=True):
                    p.grad = (b + 0.01 * torch.randn_like(b)) / 16
                opt.step()

    dbg = support.watching(model, loop, watched)
    with torch.no_grad():
        return float((model(xv).argmax(1) == yv).float().mean()), dbg


def test_per_sample_gradients_put_together_by_hand_are_not_discarded() -> None:
    plain, _ = _per_sample(watched=False)
    chance = float(torch.bincount(_data(4 * BATCH, 2)[1]).max()) / (4 * BATCH)
    assert plain > chance + 0.2, (plain, chance)  # it learns: nothing was thrown away
    accuracy, dbg = _per_sample(watched=True)
    assert accuracy == plain  # the debugger changed nothing
    assert KIND not in {h.kind.value for h in dbg.hypotheses()}, dbg.explain_failure()
    assert dbg._recorder.coverage.discarded_backwards == 0
