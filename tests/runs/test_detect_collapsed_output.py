"""A layer's output collapsed to nothing: a VAE whose reconstruction loss is averaged over pixels and batch while
its KL divergence is summed (the KL term outweighs it: posterior collapse). Ground truth is plain torch in each
test (forward hooks on the layers): the encoder's mean and log-variance layers end at a few hundredths of their
starting scale and the held-out negative ELBO is far worse than the summed twin's. Silent twins: the same VAE with
the summed reconstruction loss, a classifier whose hidden layers shrink as it learns (but not to nothing), and a
regression; and the debugger leaves the training bit-identical."""

from __future__ import annotations

from collections.abc import Callable

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

KIND = "collapsed_output"
PIXELS = 64
LATENT = 4
STEPS = 480


def images(step: int) -> torch.Tensor:
    """Binary 8x8 images: one of 10 fixed random templates with 5 % of its pixels flipped."""
    templates = (torch.rand(10, PIXELS, generator=torch.Generator().manual_seed(11)) > 0.5).float()
    g = torch.Generator().manual_seed(70_000 + step)
    picked = templates[torch.randint(0, 10, (32,), generator=g)]
    flips = (torch.rand(32, PIXELS, generator=g) < 0.05).float()
    return (picked + flips) % 2


class VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(PIXELS, 32)
        self.mu = nn.Linear(32, LATENT)
        self.logvar = nn.Linear(32, LATENT)
        self.dec = nn.Linear(LATENT, 32)
        self.out = nn.Linear(32, PIXELS)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = F.relu(self.enc(x))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.out(F.relu(self.dec(z)))), mu, logvar


def vae_loss(reduction: str) -> Callable[[tuple[torch.Tensor, ...], torch.Tensor], torch.Tensor]:
    def loss(out: tuple[torch.Tensor, ...], x: torch.Tensor) -> torch.Tensor:
        recon, mu, logvar = out
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return F.binary_cross_entropy(recon, x, reduction=reduction) + kld

    return loss


def train(
    model: nn.Module,
    make: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[..., torch.Tensor],
    watched: bool,
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None,
    losses: list[float] | None = None,
) -> tuple[dict[str, list[float]], NeuralDbg | None]:
    """A user's loop (no NeuralDBG call inside), Adam 1e-3 unless ``optimizer`` makes another; plain forward
    hooks record each layer's output root-mean-square at every step (the ground truth), ``losses`` the losses."""
    opt = optimizer(model) if optimizer else torch.optim.Adam(model.parameters(), lr=1e-3)
    scales: dict[str, list[float]] = {}
    hooks = []
    for name, module in model.named_children():

        def hook(_m: nn.Module, _i: object, out: torch.Tensor, name: str = name) -> None:
            scales.setdefault(name, []).append(float(out.detach().pow(2).mean().sqrt()))

        hooks.append(module.register_forward_hook(hook))

    def loop() -> None:
        for step in range(STEPS):
            x, y = make(step)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            if losses is not None:
                losses.append(float(loss.detach()))

    try:
        if not watched:
            loop()
            return scales, None
        with NeuralDbg(model) as dbg:
            loop()
        return scales, dbg
    finally:
        for h in hooks:
            h.remove()


def ratio(values: list[float]) -> float:
    """A layer's output scale over the last quarter (median) against its first step's."""
    tail = sorted(values[-len(values) // 4 :])
    return tail[len(tail) // 2] / values[0]


def pairs(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = images(step)
    return x, x


@torch.no_grad()
def held_out_elbo(model: nn.Module) -> float:
    """The negative ELBO per image on held-out images, with the correct (summed) loss."""
    torch.manual_seed(123)
    x = torch.cat([images(50_000 + i) for i in range(4)])
    return float(vae_loss("sum")(model(x), x)) / len(x)


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_a_vae_whose_kl_term_outweighs_its_averaged_reconstruction_collapses_and_is_found():
    torch.manual_seed(0)
    model = VAE()
    scales, _ = train(model, pairs, vae_loss("mean"), watched=False)
    torch.manual_seed(0)
    twin = VAE()
    twin_scales, _ = train(twin, pairs, vae_loss("sum"), watched=False)
    # plain torch: the encoder's mean and log-variance collapse to the prior, the summed twin's do not, and the
    # collapsed model's held-out negative ELBO is far worse
    assert ratio(scales["mu"]) < 0.1 and ratio(scales["logvar"]) < 0.1, (scales["mu"][0], scales["mu"][-1])
    assert ratio(twin_scales["mu"]) > 1.0
    assert held_out_elbo(model) > 1.2 * held_out_elbo(twin)

    torch.manual_seed(0)
    _, dbg = train(VAE(), pairs, vae_loss("mean"), watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND
    assert hits[0].root.layer == "mu"
    assert "logvar" in hits[0].root.detail
    assert hits[0].root.metrics["ratio"] < 0.1
    assert "KL" in hits[0].suggestion

    torch.manual_seed(0)
    _, healthy = train(VAE(), pairs, vae_loss("sum"), watched=True)
    assert healthy is not None and not found(healthy), healthy.explain_failure()


def test_a_classifier_whose_hidden_layers_shrink_as_it_learns_is_silent():
    """Hidden layers initialised five times too large shrink as plain SGD trains the classifier (plain torch: to
    just under their starting scale, never near nothing) while its loss falls."""
    make = support.classification_batches((32,), 10, batch=64)

    def big() -> nn.Sequential:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        with torch.no_grad():
            m[0].weight.mul_(5.0)
            m[2].weight.mul_(5.0)
        return m

    def sgd(m: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(m.parameters(), lr=1e-3)

    losses: list[float] = []
    scales, _ = train(big(), make, F.cross_entropy, watched=False, optimizer=sgd, losses=losses)
    assert all(0.1 < ratio(scales[name]) < 1.0 for name in ("0", "2")), {k: ratio(v) for k, v in scales.items()}
    assert sum(losses[-20:]) < 0.8 * sum(losses[:20])  # it learns
    _, dbg = train(big(), make, F.cross_entropy, watched=True, optimizer=sgd)
    assert dbg is not None and not found(dbg), dbg.explain_failure()


def test_an_activation_whose_units_died_is_the_dead_units_story():
    """A ReLU after a Linear whose bias starts at -10: plain torch, every unit is 0 from the first step (its output
    collapses with them), while the Linear before it keeps its scale; the ReLU holds no parameters."""
    make = support.classification_batches((32,), 10, batch=64)

    def dead() -> nn.Sequential:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        with torch.no_grad():
            m[2].bias.fill_(-10.0)
        return m

    scales, _ = train(dead(), make, F.cross_entropy, watched=False)
    assert scales["3"][0] == 0.0 and max(scales["3"]) == 0.0  # every ReLU unit dead at every step
    assert ratio(scales["2"]) > 0.5
    _, dbg = train(dead(), make, F.cross_entropy, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert any(h.kind.value == "dead_neurons" for h in dbg.hypotheses())


def test_a_regression_is_silent():
    make = support.regression_batches(16, batch=64)
    torch.manual_seed(0)
    scales, _ = train(support.mlp(width=32, depth=2), make, F.mse_loss, watched=False)
    assert all(ratio(v) > 0.1 for v in scales.values())
    torch.manual_seed(0)
    _, dbg = train(support.mlp(width=32, depth=2), make, F.mse_loss, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()


def test_watching_the_output_scales_leaves_the_training_bit_identical():
    torch.manual_seed(0)
    plain = VAE()
    train(plain, pairs, vae_loss("mean"), watched=False)
    torch.manual_seed(0)
    watched = VAE()
    _, dbg = train(watched, pairs, vae_loss("mean"), watched=True)
    assert dbg is not None and dbg._recorder.coverage.outputs.order  # the output scales were taken
    for a, b in zip(plain.parameters(), watched.parameters()):
        assert torch.equal(a, b)
