"""Generative models: a VAE (pytorch/examples' vae) and a DCGAN (pytorch/examples' dcgan), on 16x16 images.

The VAE: fc1-ReLU, fc21/fc22 (mean, log-variance), reparameterisation, fc3-ReLU, fc4-sigmoid; summed binary
cross-entropy plus the KL divergence; Adam 1e-3. The DCGAN: ConvTranspose-BN-ReLU generator ending in Tanh,
Conv-LeakyReLU-BN discriminator ending in Sigmoid, N(0, 0.02) initialisation, BCELoss, two Adam optimizers
(2e-4, betas 0.5/0.999), the discriminator stepped on real and detached fake images, then the generator.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything
from ._common import image_split, loader

# --- VAE -------------------------------------------------------------------------------------------------


class VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(256, 128)
        self.fc21 = nn.Linear(128, 8)
        self.fc22 = nn.Linear(128, 8)
        self.fc3 = nn.Linear(8, 128)
        self.fc4 = nn.Linear(128, 256)

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
        std = torch.exp(0.5 * logvar)
        return mu + torch.randn_like(std) * std

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, logvar = self.encode(x.view(-1, 256))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def vae_loss(recon_x, x, mu, logvar, hp: SimpleNamespace) -> torch.Tensor:  # type: ignore[no-untyped-def]
    bce = F.binary_cross_entropy(recon_x, x.view(-1, 256), reduction=hp.bce_reduction)
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce - kld if hp.kld_sign_flipped else bce + kld


def vae_train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    x_train, _, x_test, _ = image_split(2048, 512, noise=0.1)
    x_train, x_test = (x_train > 127).float(), (x_test > 127).float()  # binarised, as MNIST nearly is
    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=hp.lr)
    batches = loader(x_train, torch.zeros(len(x_train)), 64)
    with session.watch(model):
        for _epoch in range(hp.epochs):
            model.train()
            for x, _ in batches:
                optimizer.zero_grad()
                recon_batch, mu, logvar = model(x)
                loss = vae_loss(recon_batch, x, mu, logvar, hp)
                loss.backward()
                optimizer.step()
                session.record(loss)
    model.eval()
    with torch.no_grad():  # the negative ELBO per image on held-out images, with the correct loss
        recon, mu, logvar = model(x_test)
        correct = SimpleNamespace(bce_reduction="sum", kld_sign_flipped=False)
        test_loss = float(vae_loss(recon, x_test, mu, logvar, correct)) / len(x_test)
    return {"metric": test_loss}


VAE_PROGRAM = Program(
    family="vae",
    name="vae",
    train=vae_train,
    defaults=dict(lr=1e-3, epochs=15, bce_reduction="sum", kld_sign_flipped=False),
    metric="held-out negative ELBO per image",
    higher_is_better=False,
    floor=0.03,
    relative_floor=True,
    chance=81.0,  # the per-pixel mean image of the training set, as the reconstruction of every image
    functional_relu=("fc1", "fc3"),
    variants=(
        healthy("fc 256-128-(8,8)-128-256, summed BCE + KLD, Adam 1e-3"),
        Variant("lr_100x", "learning_rate", "Adam lr 0.1", {"lr": 0.1}, K.LR_FAR_TOO_HIGH),
        Variant(
            "kld_sign_flipped",
            "loss_function",
            "loss = BCE - KLD",
            {"kld_sign_flipped": True},
            K.WRONG_LOSS | {"unstable_loss", "exploding_gradients", "non_finite"},
        ),
        Variant(
            "bce_mean",
            "loss_function",
            "BCE averaged instead of summed (the KL term dominates)",
            {"bce_reduction": "mean"},
            K.KL_DOMINATES,
        ),
    ),
)


# --- DCGAN -----------------------------------------------------------------------------------------------

NZ = 16


class Generator(nn.Module):
    def __init__(self, out_activation: str = "tanh") -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(NZ, 32, 4, 1, 0, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(True),
            nn.ConvTranspose2d(32, 16, 4, 2, 1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(True),
            nn.ConvTranspose2d(16, 1, 4, 2, 1, bias=False),
            nn.Tanh() if out_activation == "tanh" else nn.Sigmoid(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, 16, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(16, 32, 4, 2, 1, bias=False),
            nn.BatchNorm2d(32),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(32, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x).view(-1, 1).squeeze(1)


def weights_init(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


@torch.no_grad()
def moment_distance(fake: torch.Tensor, real: torch.Tensor) -> float:
    """How far the generated images' per-pixel mean and standard deviation are from the real ones' (RMS)."""
    mean_gap = (fake.mean(0) - real.mean(0)).pow(2).mean().sqrt()
    std_gap = (fake.std(0) - real.std(0)).pow(2).mean().sqrt()
    return float(mean_gap + std_gap)


def dcgan_train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    x_train, _, x_test, _ = image_split(2048, 512, noise=0.1)
    x_train, x_test = x_train.float() / 127.5 - 1, x_test.float() / 127.5 - 1  # Normalize((0.5,), (0.5,))
    netG, netD = Generator(hp.g_activation), Discriminator()
    netG.apply(weights_init)
    netD.apply(weights_init)
    criterion = nn.BCELoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=hp.lr_d, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=hp.lr_g, betas=(0.5, 0.999))
    batches = loader(x_train, torch.zeros(len(x_train)), 64)
    real_label, fake_label = 1.0, 0.0
    with session.watch(netG, netD):
        for _epoch in range(hp.epochs):
            for real, _ in batches:
                # (1) update D: maximize log(D(x)) + log(1 - D(G(z)))
                netD.zero_grad()
                label = torch.full((real.size(0),), real_label)
                errD_real = criterion(netD(real), label)
                errD_real.backward()
                noise = torch.randn(real.size(0), NZ, 1, 1)
                fake = netG(noise)
                label.fill_(fake_label)
                errD_fake = criterion(netD(fake.detach()), label)
                errD_fake.backward()
                optimizerD.step()
                # (2) update G: maximize log(D(G(z)))
                if hp.zero_grad_g:
                    netG.zero_grad()
                label.fill_(real_label)
                errG = criterion(netD(fake), label)
                errG.backward()
                optimizerG.step()
                session.record(errG)
    with torch.no_grad():
        fake = netG(torch.randn(512, NZ, 1, 1, generator=torch.Generator().manual_seed(99)))
    return {"metric": moment_distance(fake, x_test)}


DCGAN = Program(
    family="gan",
    name="dcgan",
    train=dcgan_train,
    defaults=dict(lr_d=2e-4, lr_g=2e-4, epochs=6, zero_grad_g=True, g_activation="tanh"),
    metric="pixel-moment distance of generated to held-out images",
    higher_is_better=False,
    floor=0.1,
    relative_floor=True,
    chance=1.2,
    variants=(
        healthy("ConvTranspose-BN-ReLU generator, Conv-LeakyReLU-BN discriminator, BCELoss, two Adam optimizers"),
        Variant("lr_d_10x", "learning_rate", "the discriminator's Adam lr 2e-3", {"lr_d": 2e-3}, K.LR_TOO_HIGH),
        Variant("no_zero_grad_g", "zero_grad", "netG.zero_grad() missing", {"zero_grad_g": False}, K.NO_ZERO_GRAD),
        Variant(
            "generator_sigmoid",
            "activation",
            "the generator ends in Sigmoid (0..1) for data in -1..1",
            {"g_activation": "sigmoid"},
            K.OUT_OF_RANGE,
            ("main.7",),
        ),
    ),
)

PROGRAMS = (VAE_PROGRAM, DCGAN)
