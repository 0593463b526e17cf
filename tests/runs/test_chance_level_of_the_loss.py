"""Which chance level a loss has. A contrastive loss at chance: SimCLR's NT-Xent picks each view's partner among
the batch's other 2N - 1 views (its own similarity masked with -inf), so a model that learns nothing sits at
log(2N - 1), whatever its embedding width. Ground truth is plain torch in each test: with the second view taken
from another sample (two loaders shuffled apart), the loss stays at log(2N - 1) and a held-out view finds its
partner no better than by chance; the healthy twin's loss falls far below and it finds its partner. A mean squared
error has no log(classes), however many outputs the model has."""

from __future__ import annotations

import math
import statistics

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

BATCH = 32
STEPS = 120
MIXING = torch.randn(16, 16, generator=torch.Generator().manual_seed(5))


def views(step: int, apart: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Two noisy views of the same 16-d samples (noise as large as the signal), or (``apart``) the second view of
    other samples."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, 16, generator=g) @ MIXING
    noise = float(MIXING.norm()) / 4
    a = x + noise * torch.randn(BATCH, 16, generator=g)
    b = x + noise * torch.randn(BATCH, 16, generator=g)
    if apart:
        b = b[torch.randperm(BATCH, generator=g)]
    return a, b


def nt_xent(z: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    """z holds the two views' embeddings, first views then second views; each one's partner is the other view."""
    z = F.normalize(z, dim=1)
    sim = z @ z.t() / 0.2
    sim = sim.masked_fill(torch.eye(len(z), dtype=torch.bool), float("-inf"))
    n = len(z) // 2
    partners = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, partners)


def encoder() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))


def run(apart: bool, watched: bool):
    torch.manual_seed(0)
    model = encoder()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)

    def make(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = views(step, apart)
        return torch.cat([a, b]), torch.zeros(())

    if watched:
        dbg, losses = support.train(model, make, nt_xent, steps=STEPS, optimizer=opt)
        return model, losses, dbg
    return model, support.plain_train(model, make, nt_xent, steps=STEPS, optimizer=opt), None


def partner_found(model: nn.Module) -> float:
    a, b = views(10_000, apart=False)
    with torch.no_grad():
        za, zb = F.normalize(model(a), dim=1), F.normalize(model(b), dim=1)
    return float(((za @ zb.t()).argmax(1) == torch.arange(BATCH)).float().mean())


def test_views_taken_apart_leave_the_loss_at_the_batch_chance_and_the_twin_is_silent():
    chance = math.log(2 * BATCH - 1)
    faulty, losses, _ = run(apart=True, watched=False)
    healthy, healthy_losses, _ = run(apart=False, watched=False)
    # plain torch: the fault's loss stays at log(2N - 1) and its views find their partners no better than chance
    assert abs(sum(losses[-20:]) / 20 - chance) < 0.05 * chance
    assert sum(healthy_losses[-20:]) / 20 < 0.7 * chance
    assert partner_found(faulty) < 0.35 < 0.5 < partner_found(healthy)

    _, watched, dbg = run(apart=True, watched=True)
    assert watched == losses  # the debugger changes nothing
    kinds = [h.kind.value for h in dbg.hypotheses()]
    assert kinds[:1] == ["loss_at_chance"], dbg.explain_failure()
    assert f"log({2 * BATCH - 1})" in dbg.hypotheses()[0].explanation

    _, _, twin = run(apart=False, watched=True)
    assert twin.healthy, twin.explain_failure()


def test_a_regression_of_two_outputs_near_log_2_is_no_classifier_at_chance():
    """A mean squared error over two outputs that starts and ends near log 2 = 0.693 while its targets' variance is
    0.8: a linear model explaining a quarter of it (plain torch: held-out R^2 about 0.2), not two classes at chance
    (a diffusion model's two noise coordinates were called so)."""

    def make(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(128, 4, generator=g)
        part = 0.46 * x[:, :1]
        return x, torch.cat([part + 1.17 * torch.sin(3 * x[:, 1:2]), -part + 1.17 * torch.sin(3 * x[:, 2:3])], 1)

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.mul_(0.05)
        model.bias.zero_()
    dbg, losses = support.train(
        model, make, F.mse_loss, steps=200, optimizer=torch.optim.Adam(model.parameters(), 3e-3)
    )
    x, y = make(10_000)
    with torch.no_grad():
        r2 = float(1 - F.mse_loss(model(x), y) / y.var(0).mean())
    assert r2 > 0.15  # plain torch: it learned what a linear model can
    assert abs(sum(losses[-20:]) / 20 - math.log(2)) < 0.05 * math.log(2)  # ... and ends by log 2
    assert "loss_at_chance" not in [h.kind.value for h in dbg.hypotheses()], dbg.explain_failure()


def test_a_segmentation_whose_pixel_labels_do_not_depend_on_the_image_is_at_the_chance_of_its_classes():
    """Per-pixel cross-entropy over (N, 2, 24, 24) logits with labels drawn apart from the images: nothing to learn,
    the loss stays at log 2 (plain torch: held-out pixel accuracy a coin flip). The chance level is that of the
    loss's 2 classes (its input's dimension 1), not of the logits' last dimension (the image's width, 24: log 24 =
    3.2, which the loss never comes near)."""

    def run(watched: bool) -> tuple[list[float], float, NeuralDbg | None]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 2, 1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        losses: list[float] = []

        def loop() -> None:
            for _ in range(150):
                x = torch.randn(16, 1, 24, 24, generator=g)
                y = torch.randint(0, 2, (16, 24, 24), generator=g)  # drawn apart from x
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                losses.append(loss.item())

        dbg = support.watching(model, loop, watched)
        x, y = torch.randn(64, 1, 24, 24, generator=g), torch.randint(0, 2, (64, 24, 24), generator=g)
        with torch.no_grad():
            accuracy = float((model(x).argmax(1) == y).float().mean())
        return losses, accuracy, dbg

    plain, accuracy, _ = run(watched=False)
    assert abs(accuracy - 0.5) < 0.02
    assert abs(statistics.fmean(plain[-40:]) - math.log(2)) < 0.01
    losses, _, dbg = run(watched=True)
    assert losses == plain and dbg is not None
    kinds = [h.kind.value for h in dbg.hypotheses()]
    assert kinds and kinds[0] == "loss_at_chance", dbg.explain_failure()
    assert dbg.hypotheses()[0].root.metrics["classes"] == 2
