"""More small healthy training programs of families no other test holds, in the style of
``tests/healthy_families.py`` (whose :class:`~healthy_families.PlainHealth` measures them): metric learning, flows,
adversarial training with a gradient penalty, physics-informed losses, positional encodings, adapters on a frozen
base, EMA teachers, one-cycle, warm-up, cyclic and restarting schedules, the classification losses users write by
hand, adversarial and sharpness-aware training, generative models (VAE, VQ-VAE, DDPM) and transfer learning.

A program returns its loss per optimiser step, or, where the training loss is not meant to fall (the critic of a
GAN), a held-out measure of the fit per step that falls as the program learns.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from healthy_families import Observe
from torch import nn


def triplet_metric_learning(observe: Observe) -> list[float]:
    """A Siamese embedding net trained with TripletMarginLoss: anchor and positive from one class, negative from
    another, embeddings L2-normalised, margin 0.2."""
    torch.manual_seed(0)
    centres = torch.randn(8, 24)
    net = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))
    criterion = nn.TripletMarginLoss(margin=0.2)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def embed(x: torch.Tensor) -> torch.Tensor:
        return F.normalize(net(x), dim=1)

    losses: list[float] = []
    with observe(net):
        for _ in range(150):
            a_cls = torch.randint(0, 8, (64,))
            n_cls = (a_cls + torch.randint(1, 8, (64,))) % 8
            anchor = centres[a_cls] + 0.7 * torch.randn(64, 24)
            positive = centres[a_cls] + 0.7 * torch.randn(64, 24)
            negative = centres[n_cls] + 0.7 * torch.randn(64, 24)
            loss = criterion(embed(anchor), embed(positive), embed(negative))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def realnvp_flow(observe: Observe) -> list[float]:
    """A RealNVP-style normalising flow on 2-D two-moons-like data: four affine coupling layers with alternating
    masks, tanh-bounded log-scales, the loss the negative log-likelihood (base log-density plus the log-determinant)."""

    class Coupling(nn.Module):
        def __init__(self, mask: torch.Tensor) -> None:
            super().__init__()
            self.register_buffer("mask", mask)
            self.net = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            kept = x * self.mask
            log_s, t = self.net(kept).chunk(2, dim=1)
            log_s = torch.tanh(log_s) * (1 - self.mask)
            t = t * (1 - self.mask)
            y = kept + (1 - self.mask) * (x * torch.exp(log_s) + t)
            return y, log_s.sum(dim=1)

    class Flow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            masks = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])] * 2
            self.layers = nn.ModuleList(Coupling(m) for m in masks)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            log_det = torch.zeros(x.size(0))
            for layer in self.layers:
                x, ld = layer(x)
                log_det = log_det + ld
            return x, log_det

    torch.manual_seed(0)

    def moons(n: int) -> torch.Tensor:
        angle = torch.rand(n) * math.pi
        upper = torch.rand(n) < 0.5
        x = torch.where(upper, torch.cos(angle), 1 - torch.cos(angle))
        y = torch.where(upper, torch.sin(angle), 0.5 - torch.sin(angle))
        return torch.stack([x, y], dim=1) * 3 + 0.1 * torch.randn(n, 2)

    flow = Flow()
    optimizer = torch.optim.Adam(flow.parameters(), lr=2e-3)
    base = torch.distributions.Normal(0.0, 1.0)
    losses: list[float] = []
    with observe(flow):
        for _ in range(300):
            z, log_det = flow(moons(128))
            loss = -(base.log_prob(z).sum(dim=1) + log_det).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def _moment_distance(fake: torch.Tensor, real: torch.Tensor) -> float:
    """How far generated samples' mean and covariance are from the real ones' (a held-out fit measure)."""
    mean = (fake.mean(0) - real.mean(0)).norm()
    cov = (torch.cov(fake.T) - torch.cov(real.T)).norm()
    return float(mean + cov)


def wgan_gp(observe: Observe) -> list[float]:
    """WGAN-GP on a 2-D Gaussian: the critic trained 5 times per generator step with the gradient penalty
    (torch.autograd.grad of the critic at interpolates, create_graph=True, lambda 10), Adam(0, 0.9).
    The measure per generator step is the generated samples' moment distance to held-out real samples."""
    torch.manual_seed(0)
    mean, scale = torch.tensor([2.0, -1.0]), torch.tensor([[1.0, 0.0], [0.6, 0.5]])

    def real_batch(n: int) -> torch.Tensor:
        return torch.randn(n, 2) @ scale.T + mean

    generator = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    critic = nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
    g_opt = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.0, 0.9))
    c_opt = torch.optim.Adam(critic.parameters(), lr=1e-3, betas=(0.0, 0.9))
    held_out = real_batch(512)
    z_fixed = torch.randn(512, 4, generator=torch.Generator().manual_seed(7))
    distances: list[float] = []
    with observe(generator), observe(critic):
        for _ in range(150):
            for _ in range(5):
                real = real_batch(64)
                fake = generator(torch.randn(64, 4)).detach()
                alpha = torch.rand(64, 1)
                mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
                grads = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)[0]
                penalty = ((grads.norm(2, dim=1) - 1) ** 2).mean()
                c_loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
                c_opt.zero_grad()
                c_loss.backward()
                c_opt.step()
            g_loss = -critic(generator(torch.randn(64, 4))).mean()
            g_opt.zero_grad()
            g_loss.backward()
            g_opt.step()
            with torch.no_grad():
                distances.append(_moment_distance(generator(z_fixed), held_out))
    return distances


def spectral_norm_gan(observe: Observe) -> list[float]:
    """A GAN with a spectral_norm discriminator (torch.nn.utils.parametrizations.spectral_norm on every Linear),
    the non-saturating BCE-with-logits loss, Adam(0, 0.9) with the discriminator at twice the rate; the measure per
    step is the generated samples' moment distance to held-out real samples."""
    from torch.nn.utils.parametrizations import spectral_norm

    torch.manual_seed(0)
    mean, scale = torch.tensor([-1.0, 1.5]), torch.tensor([[0.8, 0.0], [-0.4, 0.6]])

    def real_batch(n: int) -> torch.Tensor:
        return torch.randn(n, 2) @ scale.T + mean

    generator = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    discriminator = nn.Sequential(
        spectral_norm(nn.Linear(2, 64)),
        nn.LeakyReLU(0.2),
        spectral_norm(nn.Linear(64, 64)),
        nn.LeakyReLU(0.2),
        spectral_norm(nn.Linear(64, 1)),
    )
    g_opt = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.0, 0.9))
    d_opt = torch.optim.Adam(discriminator.parameters(), lr=2e-3, betas=(0.0, 0.9))
    held_out = real_batch(512)
    z_fixed = torch.randn(512, 4, generator=torch.Generator().manual_seed(7))
    ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)
    distances: list[float] = []
    with observe(generator), observe(discriminator):
        for _ in range(200):
            fake = generator(torch.randn(64, 4))
            d_loss = F.binary_cross_entropy_with_logits(
                discriminator(real_batch(64)), ones
            ) + F.binary_cross_entropy_with_logits(discriminator(fake.detach()), zeros)
            d_opt.zero_grad()
            d_loss.backward()
            d_opt.step()
            g_loss = F.binary_cross_entropy_with_logits(discriminator(fake), ones)
            g_opt.zero_grad()
            g_loss.backward()
            g_opt.step()
            with torch.no_grad():
                distances.append(_moment_distance(generator(z_fixed), held_out))
    return distances


def physics_informed_net(observe: Observe) -> list[float]:
    """A physics-informed net solving u'' = -pi^2 sin(pi x) on [0, 1] with u(0) = u(1) = 0: a tanh MLP, the
    residual's derivatives taken with torch.autograd.grad(create_graph=True), collocation points redrawn each
    step, the boundary loss weighted 10."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    boundary = torch.tensor([[0.0], [1.0]])
    losses: list[float] = []
    with observe(net):
        for _ in range(200):
            x = torch.rand(64, 1, requires_grad=True)
            u = net(x)
            du = torch.autograd.grad(u.sum(), x, create_graph=True)[0]
            d2u = torch.autograd.grad(du.sum(), x, create_graph=True)[0]
            residual = d2u + math.pi**2 * torch.sin(math.pi * x)
            loss = residual.pow(2).mean() + 10 * net(boundary).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def nerf_positional_encoding(observe: Observe) -> list[float]:
    """A NeRF-style coordinate MLP: 2-D coordinates through a sin/cos positional encoding of 6 octaves, a ReLU MLP
    with a skip of the encoding into its middle, a sigmoid RGB head, MSE to a procedural image."""

    def encode(p: torch.Tensor, octaves: int = 6) -> torch.Tensor:
        freqs = (2.0 ** torch.arange(octaves)) * math.pi
        angles = p.unsqueeze(-1) * freqs
        return torch.cat([p, torch.sin(angles).flatten(1), torch.cos(angles).flatten(1)], dim=1)

    class Field(nn.Module):
        def __init__(self, width: int = 64) -> None:
            super().__init__()
            enc = 2 + 2 * 2 * 6
            self.first = nn.Sequential(nn.Linear(enc, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
            self.second = nn.Sequential(nn.Linear(width + enc, width), nn.ReLU(), nn.Linear(width, 3))

        def forward(self, coords: torch.Tensor) -> torch.Tensor:
            e = encode(coords)
            return torch.sigmoid(self.second(torch.cat([self.first(e), e], dim=1)))

    def image(p: torch.Tensor) -> torch.Tensor:
        r = 0.5 + 0.5 * torch.sin(6 * p[:, :1]) * torch.cos(4 * p[:, 1:])
        g = (p.norm(dim=1, keepdim=True) < 0.6).float()
        b = 0.5 + 0.5 * torch.sin(3 * (p[:, :1] + p[:, 1:]))
        return torch.cat([r, g, b], dim=1)

    torch.manual_seed(0)
    model = Field()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            coords = torch.rand(256, 2) * 2 - 1
            loss = F.mse_loss(model(coords), image(coords))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def _pretrained_backbone(seed: int) -> tuple[nn.Sequential, torch.Tensor]:
    """A small MLP backbone trained on a source task of 8 classes (the "pretrained" weights), and that task's
    class directions, which the target tasks below share."""
    torch.manual_seed(seed)
    w = torch.randn(20, 8)
    backbone = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    head = nn.Linear(64, 8)
    opt = torch.optim.Adam([*backbone.parameters(), *head.parameters()], lr=3e-3)
    for _ in range(150):
        x = torch.randn(64, 20)
        opt.zero_grad()
        F.cross_entropy(head(backbone(x)), (x @ w).argmax(dim=1)).backward()
        opt.step()
    return backbone, w


def frozen_backbone_new_head(observe: Observe) -> list[float]:
    """Transfer learning: a pretrained backbone frozen (requires_grad_(False), eval()), a new Linear head for a
    4-class target task trained with SGD + momentum over ``filter(lambda p: p.requires_grad, ...)``."""
    backbone, w = _pretrained_backbone(0)

    class Transfer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = backbone
            self.head = nn.Linear(64, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.backbone(x))

    model = Transfer()
    model.backbone.requires_grad_(False)
    model.backbone.eval()
    optimizer = torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=0.05, momentum=0.9)
    losses: list[float] = []
    with observe(model):
        for _ in range(120):
            x = torch.randn(64, 20)
            y = (x @ w[:, :4]).argmax(dim=1)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def lora_finetuning(observe: Observe) -> list[float]:
    """LoRA fine-tuning: every Linear of a pretrained network wrapped with a frozen base (requires_grad False) and
    a rank-4 adapter, A Kaiming-initialised and B zero-initialised (so the adapter starts as the identity edit),
    scaled by alpha / r; AdamW over the adapters only, on a shifted target task."""

    class LoRALinear(nn.Module):
        def __init__(self, base: nn.Linear, r: int = 4, alpha: float = 8.0) -> None:
            super().__init__()
            self.base = base
            self.base.weight.requires_grad = False
            if self.base.bias is not None:
                self.base.bias.requires_grad = False
            self.lora_A = nn.Parameter(torch.empty(r, base.in_features))
            self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            self.scaling = alpha / r

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + (x @ self.lora_A.T @ self.lora_B.T) * self.scaling

    backbone, w = _pretrained_backbone(1)
    head = nn.Linear(64, 8)
    model = nn.Sequential(*(LoRALinear(m) if isinstance(m, nn.Linear) else m for m in backbone), LoRALinear(head))
    w_target = w + 0.8 * torch.randn_like(w)
    trainable = [p for n, p in model.named_parameters() if "lora_" in n]
    optimizer = torch.optim.AdamW(trainable, lr=3e-3, weight_decay=0.01)
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            x = torch.randn(64, 20)
            loss = F.cross_entropy(model(x), (x @ w_target).argmax(dim=1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def mean_teacher_ema(observe: Observe) -> list[float]:
    """Mean teacher semi-supervised learning: the teacher is ``copy.deepcopy(student)`` made inside the watched
    block and updated as an EMA (0.99) of the student; the loss is CE on 16 labelled samples plus the MSE between
    the student's and the teacher's softmax on noisy unlabelled samples."""
    torch.manual_seed(0)
    w = torch.randn(16, 4)
    student = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(student.parameters(), lr=3e-3)
    losses: list[float] = []
    with observe(student):
        teacher = copy.deepcopy(student)
        for p in teacher.parameters():
            p.requires_grad_(False)
        for step in range(200):
            x_l = torch.randn(16, 16)
            y_l = (x_l @ w).argmax(dim=1)
            x_u = torch.randn(64, 16)
            s_out = student(x_u + 0.1 * torch.randn_like(x_u))
            with torch.no_grad():
                t_out = teacher(x_u + 0.1 * torch.randn_like(x_u))
            consistency = F.mse_loss(s_out.softmax(1), t_out.softmax(1))
            ramp = min(1.0, step / 50)
            loss = F.cross_entropy(student(x_l), y_l) + 5.0 * ramp * consistency
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for t_p, s_p in zip(teacher.parameters(), student.parameters(), strict=True):
                    t_p.mul_(0.99).add_(s_p, alpha=0.01)
            losses.append(loss.item())
    return losses


def byol(observe: Observe) -> list[float]:
    """BYOL: an online encoder + projector + predictor, a target made by ``copy.deepcopy`` of the online network
    inside the watched block and updated by EMA (0.98), the symmetric normalised-MSE loss between the online
    prediction of one view and the target projection of the other."""
    torch.manual_seed(0)

    class Online(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(20, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 32))
            self.projector = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.projector(self.encoder(x))

    online = Online()
    predictor = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 16))
    optimizer = torch.optim.Adam([*online.parameters(), *predictor.parameters()], lr=1e-3)
    centres = torch.randn(64, 20) * 2

    def regression(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return (2 - 2 * F.cosine_similarity(p, z.detach(), dim=1)).mean()

    losses: list[float] = []
    with observe(online):
        target = copy.deepcopy(online)
        for p in target.parameters():
            p.requires_grad_(False)
        for _ in range(150):
            x = centres[torch.randint(0, 64, (64,))] + 0.3 * torch.randn(64, 20)
            v1, v2 = x + 0.3 * torch.randn_like(x), x * (1 + 0.2 * torch.randn_like(x))
            with torch.no_grad():
                t1, t2 = target(v1), target(v2)
            loss = regression(predictor(online(v1)), t2) + regression(predictor(online(v2)), t1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for t_p, o_p in zip(target.parameters(), online.parameters(), strict=True):
                    t_p.lerp_(o_p, 0.02)
            losses.append(loss.item())
    return losses


def onecycle_transformer(observe: Observe) -> list[float]:
    """A two-layer Transformer encoder (pre-norm, 4 heads) classifying whether a token sequence holds more 1s
    than 2s, mean-pooled; AdamW under OneCycleLR with a 3e-3 peak, clip_grad_norm_(1.0) every step."""

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(8, 32)
            self.pos = nn.Parameter(torch.randn(1, 16, 32) * 0.02)
            layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(32)
            self.head = nn.Linear(32, 2)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            h = self.encoder(self.embed(tokens) + self.pos)
            return self.head(self.norm(h.mean(dim=1)))

    torch.manual_seed(0)
    model = Classifier()
    steps = 120
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps, pct_start=0.3)
    losses: list[float] = []
    with observe(model):
        for _ in range(steps):
            tokens = torch.randint(0, 8, (32, 16))
            y = ((tokens == 1).sum(1) > (tokens == 2).sum(1)).long()
            loss = F.cross_entropy(model(tokens), y)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
    return losses


def warmup_cosine_sgd(observe: Observe) -> list[float]:
    """A CNN with BatchNorm trained by SGD with Nesterov momentum under a LambdaLR of 20 linear warm-up steps to a
    peak of 0.4, then cosine decay to zero: the high peak BatchNorm nets are trained with."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1),
                nn.BatchNorm2d(16),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1),
                nn.BatchNorm2d(32),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
            )
            self.fc = nn.Linear(32, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.features(x).flatten(1))

    torch.manual_seed(0)
    patterns = torch.randn(4, 1, 12, 12)
    model = Net()
    steps, warmup = 120, 20
    optimizer = torch.optim.SGD(model.parameters(), lr=0.4, momentum=0.9, nesterov=True, weight_decay=5e-4)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    losses: list[float] = []
    with observe(model):
        for _ in range(steps):
            y = torch.randint(0, 4, (32,))
            x = patterns[y] + 0.8 * torch.randn(32, 1, 12, 12)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
    return losses


def focal_loss_imbalanced(observe: Observe) -> list[float]:
    """Binary detection with 5% positives and a hand-written focal loss (gamma 2, alpha 0.25), the output bias
    initialised to -log((1 - pi) / pi) with pi = 0.01 as in RetinaNet."""
    torch.manual_seed(0)
    w = torch.randn(16)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    nn.init.constant_(model[-1].bias, -math.log((1 - 0.01) / 0.01))

    def focal(logits: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0) -> torch.Tensor:
        ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        p = torch.sigmoid(logits)
        p_t = p * targets + (1 - p) * (1 - targets)
        alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
        return (alpha_t * (1 - p_t) ** gamma * ce).mean()

    threshold = torch.randn(4096, 16).matmul(w).quantile(0.95)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(200):
            x = torch.randn(128, 16)
            y = (x @ w > threshold).float().unsqueeze(1)
            loss = focal(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def mixup_label_smoothing(observe: Observe) -> list[float]:
    """A classifier trained with mixup (alpha 0.2: inputs mixed, the loss the same mix of the two labels' losses)
    and CrossEntropyLoss(label_smoothing=0.1), AdamW. The training loss swings with each batch's mixing weight, so
    the measure per step is the plain cross-entropy on a held-out batch."""
    torch.manual_seed(0)
    w = torch.randn(24, 6)
    model = nn.Sequential(nn.Linear(24, 96), nn.GELU(), nn.Linear(96, 6))
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    beta = torch.distributions.Beta(0.2, 0.2)
    x_val = torch.randn(512, 24)
    y_val = (x_val @ w).argmax(dim=1)
    held_out: list[float] = []
    with observe(model):
        for _ in range(200):
            x = torch.randn(64, 24)
            y = (x @ w).argmax(dim=1)
            lam = float(beta.sample())
            perm = torch.randperm(64)
            logits = model(lam * x + (1 - lam) * x[perm])
            loss = lam * criterion(logits, y) + (1 - lam) * criterion(logits, y[perm])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                held_out.append(F.cross_entropy(model(x_val), y_val).item())
    return held_out


def multitask_two_heads(observe: Observe) -> list[float]:
    """Multi-task learning: a shared trunk, a classification head and a regression head, the loss
    CE + 0.5 * MSE, Adam."""

    class MultiTask(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.trunk = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
            self.cls_head = nn.Linear(64, 5)
            self.reg_head = nn.Linear(64, 1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.trunk(x)
            return self.cls_head(h), self.reg_head(h).squeeze(1)

    torch.manual_seed(0)
    w_cls, w_reg = torch.randn(20, 5), torch.randn(20)
    model = MultiTask()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            x = torch.randn(64, 20)
            logits, value = model(x)
            loss = F.cross_entropy(logits, (x @ w_cls).argmax(dim=1)) + 0.5 * F.mse_loss(value, torch.sin(x @ w_reg))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def poisson_regression(observe: Observe) -> list[float]:
    """Count regression: an MLP predicting the log-rate of Poisson counts, PoissonNLLLoss(log_input=True)."""
    torch.manual_seed(0)
    w = torch.randn(12) * 0.4
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
    criterion = nn.PoissonNLLLoss(log_input=True, full=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(200):
            x = torch.randn(128, 12)
            counts = torch.poisson(torch.exp(1.0 + x @ w)).unsqueeze(1)
            loss = criterion(model(x), counts)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def quantile_regression(observe: Observe) -> list[float]:
    """Quantile regression: one net predicting the 10th, 50th and 90th percentiles of a heteroscedastic target,
    the pinball loss summed over quantiles."""
    torch.manual_seed(0)
    quantiles = torch.tensor([0.1, 0.5, 0.9])
    model = nn.Sequential(nn.Linear(1, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    def pinball(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        err = y - pred
        return torch.maximum(quantiles * err, (quantiles - 1) * err).sum(dim=1).mean()

    losses: list[float] = []
    with observe(model):
        for _ in range(200):
            x = torch.rand(128, 1) * 4 - 2
            y = 3 * torch.sin(2 * x) + 2 + (0.2 + 0.3 * x.abs()) * torch.randn(128, 1)
            loss = pinball(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def mobilenet_depthwise(observe: Observe) -> list[float]:
    """MobileNet-style depthwise-separable convolutions (a groups=channels 3x3 conv, then a 1x1 conv, each with
    BatchNorm and ReLU6), global average pooling, RMSprop as in the paper."""

    def separable(cin: int, cout: int, stride: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False),
            nn.BatchNorm2d(cin),
            nn.ReLU6(inplace=True),
            nn.Conv2d(cin, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU6(inplace=True),
        separable(16, 32, 1),
        separable(32, 64, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 4),
    )
    patterns = torch.randn(4, 3, 16, 16)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3, alpha=0.9, momentum=0.9, eps=1e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(80):
            y = torch.randint(0, 4, (32,))
            x = patterns[y] + torch.randn(32, 3, 16, 16)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def bahdanau_seq2seq(observe: Observe) -> list[float]:
    """A GRU encoder-decoder with Bahdanau (additive) attention learning to reverse digit sequences, the decoder fed
    the previous target token (teacher forcing) half of the time and its own prediction otherwise."""

    class Seq2Seq(nn.Module):
        def __init__(self, vocab: int = 12, dim: int = 32) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.encoder = nn.GRU(dim, dim, batch_first=True)
            self.w_query = nn.Linear(dim, dim, bias=False)
            self.w_keys = nn.Linear(dim, dim)
            self.v = nn.Linear(dim, 1, bias=False)
            self.decoder = nn.GRUCell(2 * dim, dim)
            self.out = nn.Linear(dim, vocab)

        def forward(self, src: torch.Tensor, tgt: torch.Tensor, teacher: bool) -> torch.Tensor:
            keys, h = self.encoder(self.embed(src))
            h = h.squeeze(0)
            projected = self.w_keys(keys)
            token = torch.zeros_like(tgt[:, 0])  # 0 is <sos>
            logits = []
            for t in range(tgt.size(1)):
                scores = self.v(torch.tanh(self.w_query(h).unsqueeze(1) + projected)).squeeze(2)
                context = (scores.softmax(dim=1).unsqueeze(2) * keys).sum(dim=1)
                h = self.decoder(torch.cat([self.embed(token), context], dim=1), h)
                step_logits = self.out(h)
                logits.append(step_logits)
                token = tgt[:, t] if teacher else step_logits.argmax(dim=1)
            return torch.stack(logits, dim=1)

    torch.manual_seed(0)
    model = Seq2Seq()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(3)
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            src = torch.randint(2, 12, (32, 6))
            tgt = src.flip(1)
            teacher = bool(torch.rand(1, generator=gen) < 0.5)
            logits = model(src, tgt, teacher)
            loss = F.cross_entropy(logits.reshape(-1, 12), tgt.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
    return losses


def clip_contrastive(observe: Observe) -> list[float]:
    """A CLIP-like model: an image encoder and a text encoder (an EmbeddingBag of tokens) projected to a shared
    space, a learnable logit scale initialised to log(1 / 0.07) and clamped at log(100), the symmetric
    cross-entropy over the batch's similarity matrix."""

    class Clip(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.image = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 24))
            self.text = nn.EmbeddingBag(40, 24, mode="mean")
            self.text_proj = nn.Linear(24, 24)
            self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

        def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
            img = F.normalize(self.image(images), dim=1)
            txt = F.normalize(self.text_proj(self.text(tokens)), dim=1)
            return self.logit_scale.clamp(max=math.log(100)).exp() * img @ txt.T

    torch.manual_seed(0)
    concepts = 32
    looks = torch.randn(concepts, 32)
    words = torch.randint(0, 40, (concepts, 4))
    model = Clip()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            idx = torch.randperm(concepts)[:16]
            images = looks[idx] + 0.5 * torch.randn(16, 32)
            logits = model(images, words[idx])
            labels = torch.arange(16)
            loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def fast_adversarial_training(observe: Observe) -> list[float]:
    """ "Fast is better than free" adversarial training: an FGSM perturbation from a random start, its gradient
    taken by ``loss.backward()`` (which also fills the parameters' ``.grad``, never zeroed before it), then
    ``optimizer.zero_grad()`` and the step on the perturbed batch."""
    torch.manual_seed(0)
    w = torch.randn(20, 4)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    epsilon, alpha = 0.05, 0.0625
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            x = torch.randn(64, 20)
            y = (x @ w).argmax(dim=1)
            delta = torch.empty_like(x).uniform_(-epsilon, epsilon).requires_grad_(True)
            F.cross_entropy(model(x + delta), y).backward()
            delta = (delta + alpha * delta.grad.sign()).clamp(-epsilon, epsilon).detach()  # type: ignore[union-attr]
            loss = F.cross_entropy(model(x + delta), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def sharpness_aware_minimisation(observe: Observe) -> list[float]:
    """SAM (davda54/sam): a first backward, the weights moved to the worst case within rho 0.05 by hand, a second
    backward there, the weights restored and the base optimizer stepped with the second gradient."""

    class SAM(torch.optim.Optimizer):
        def __init__(self, params: Any, base: type[torch.optim.Optimizer], rho: float = 0.05, **kwargs: Any) -> None:
            super().__init__(params, dict(rho=rho, **kwargs))
            self.base_optimizer = base(self.param_groups, **kwargs)
            self.param_groups = self.base_optimizer.param_groups

        @torch.no_grad()
        def first_step(self, zero_grad: bool = False) -> None:
            grads = [p.grad.norm(2) for g in self.param_groups for p in g["params"] if p.grad is not None]
            grad_norm = torch.stack(grads).norm(2)
            for group in self.param_groups:
                scale = group["rho"] / (grad_norm + 1e-12)
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    self.state[p]["old_p"] = p.data.clone()
                    p.add_(p.grad * scale)
            if zero_grad:
                self.zero_grad()

        @torch.no_grad()
        def second_step(self, zero_grad: bool = False) -> None:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    p.data = self.state[p]["old_p"]
            self.base_optimizer.step()
            if zero_grad:
                self.zero_grad()

    torch.manual_seed(0)
    w = torch.randn(16, 5)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 5))
    optimizer = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9)
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            x = torch.randn(64, 16)
            y = (x @ w).argmax(dim=1)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.first_step(zero_grad=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.second_step(zero_grad=True)
            losses.append(loss.item())
    return losses


def vae_kl_annealing(observe: Observe) -> list[float]:
    """A VAE whose KL term is annealed in: its weight beta grows linearly from 0 to 1 over the first 100 steps, so
    the total loss climbs while beta grows before it falls (Bowman et al.'s warm-up)."""

    class VAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
            self.mu = nn.Linear(64, 4)
            self.logvar = nn.Linear(64, 4)
            self.dec = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 32))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            h = self.enc(x)
            mu, logvar = self.mu(h), self.logvar(h)
            z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
            return self.dec(z), mu, logvar

    torch.manual_seed(0)
    basis = torch.randn(4, 32)
    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses: list[float] = []
    with observe(model):
        for step in range(300):
            x = torch.tanh(torch.randn(64, 4) @ basis) + 0.05 * torch.randn(64, 32)
            recon, mu, logvar = model(x)
            rec = F.mse_loss(recon, x, reduction="sum") / 64
            kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / 64
            beta = min(1.0, step / 100)
            loss = rec + beta * kl
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def multilabel_sigmoid_bce(observe: Observe) -> list[float]:
    """Multi-label tagging written with an ``nn.Sigmoid`` output layer and ``nn.BCELoss`` on separable tags,
    trained until the probabilities sit close to 0 and 1."""
    torch.manual_seed(0)
    w = torch.randn(16, 6)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 6), nn.Sigmoid())
    criterion = nn.BCELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(300):
            x = torch.randn(64, 16)
            y = (x @ w > 0.5).float()
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def hf_linear_warmup(observe: Observe) -> list[float]:
    """A transformers-style schedule: linear warm-up from 0 (the first step's learning rate is exactly 0, as
    ``get_linear_schedule_with_warmup`` gives) over 30 steps to 1e-3, then linear decay, AdamW with weight decay
    0.01 on a GELU MLP with LayerNorm."""
    torch.manual_seed(0)
    w = torch.randn(24, 3)
    model = nn.Sequential(nn.Linear(24, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 3))
    steps, warmup = 150, 30
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)

    def schedule(step: int) -> float:
        if step < warmup:
            return step / warmup
        return max(0.0, (steps - step) / (steps - warmup))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    losses: list[float] = []
    with observe(model):
        for _ in range(steps):
            x = torch.randn(32, 24)
            loss = F.cross_entropy(model(x), (x @ w).argmax(dim=1))
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses


def swa_ema_averaged_model(observe: Observe) -> list[float]:
    """An EMA of the watched model kept by ``torch.optim.swa_utils.AveragedModel`` (which deep-copies it) made
    inside the watched block, updated every step and evaluated every 20 steps on held-out data (in train mode,
    with gradients on and the output detached, as loops often do)."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    torch.manual_seed(0)
    w = torch.randn(16, 4)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    x_val = torch.randn(256, 16)
    y_val = (x_val @ w).argmax(dim=1)
    losses: list[float] = []
    with observe(model):
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.95))
        for step in range(150):
            x = torch.randn(64, 16)
            loss = F.cross_entropy(model(x), (x @ w).argmax(dim=1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ema.update_parameters(model)
            losses.append(loss.item())
            if step % 20 == 0:
                F.cross_entropy(ema(x_val).detach(), y_val)
    return losses


def sparse_autoencoder(observe: Observe) -> list[float]:
    """A sparse autoencoder of the interpretability kind: 4x overcomplete ReLU latents, an L1 penalty on them
    (coefficient 3e-3), decoder columns renormalised to unit norm after each step, on inputs that are sparse sums
    of 64 directions."""

    class SAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Linear(32, 128)
            self.relu = nn.ReLU()
            self.decoder = nn.Linear(128, 32)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            codes = self.relu(self.encoder(x - self.decoder.bias))
            return self.decoder(codes), codes

    torch.manual_seed(0)
    features = F.normalize(torch.randn(64, 32), dim=1)
    model = SAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(300):
            active = (torch.rand(128, 64) < 0.05).float() * torch.rand(128, 64) * 3
            x = active @ features
            recon, codes = model(x)
            loss = F.mse_loss(recon, x) + 3e-3 * codes.abs().sum(dim=1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                model.decoder.weight.div_(model.decoder.weight.norm(dim=0, keepdim=True))
            losses.append(loss.item())
    return losses


def domain_adversarial(observe: Observe) -> list[float]:
    """DANN domain adaptation: a feature extractor shared by a label classifier and a domain classifier behind a
    gradient reversal layer (a custom autograd.Function), so the domain loss stays near log 2 by design."""

    class Reverse(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, lam: float) -> torch.Tensor:
            ctx.lam = lam
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            return -ctx.lam * grad, None

    class DANN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
            self.label = nn.Linear(32, 4)
            self.domain = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))

        def forward(self, x: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.features(x)
            return self.label(h), self.domain(Reverse.apply(h, lam))

    torch.manual_seed(0)
    w = torch.randn(20, 4)
    shift = torch.randn(20) * 0.5
    model = DANN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    losses: list[float] = []
    with observe(model):
        for step in range(200):
            xs, xt = torch.randn(32, 20), torch.randn(32, 20) + shift
            lam = 2 / (1 + math.exp(-10 * step / 200)) - 1
            class_logits, dom_s = model(xs, lam)
            _, dom_t = model(xt, lam)
            domains = torch.cat([torch.zeros(32), torch.ones(32)]).long()
            task = F.cross_entropy(class_logits, (xs @ w).argmax(dim=1))
            loss = task + F.cross_entropy(torch.cat([dom_s, dom_t]), domains)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(task.item())
    return losses


def squeeze_excitation(observe: Observe) -> list[float]:
    """A CNN with squeeze-and-excitation blocks: channel gates from a global pool through a bottleneck and an
    ``nn.Sigmoid``, which learn to open some channels fully and close others."""

    class SE(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.fc = nn.Sequential(
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(channels, channels // 4),
                nn.ReLU(),
                nn.Linear(channels // 4, channels),
                nn.Sigmoid(),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.fc(x)[:, :, None, None]

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        SE(16),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        SE(32),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 4),
    )
    patterns = torch.randn(4, 1, 12, 12)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(100):
            y = torch.randint(0, 4, (32,))
            x = patterns[y] + 0.8 * torch.randn(32, 1, 12, 12)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def vq_vae(observe: Observe) -> list[float]:
    """A VQ-VAE: an encoder, a codebook of 32 entries (an ``nn.Embedding``) chosen by nearest neighbour, the
    straight-through estimator, the codebook and commitment (0.25) losses; codes some batches never pick. The
    codebook and commitment terms start near 0 (encoder outputs and codes both start small) and grow with the
    encoder's output, so the total loss climbs for most of the run while the reconstruction improves: the measure
    per step is the held-out reconstruction error."""

    class VQVAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 8))
            self.codebook = nn.Embedding(32, 8)
            self.codebook.weight.data.uniform_(-1 / 32, 1 / 32)
            self.decoder = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 24))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            z = self.encoder(x)
            idx = torch.cdist(z, self.codebook.weight).argmin(dim=1)
            q = self.codebook(idx)
            vq = F.mse_loss(q, z.detach()) + 0.25 * F.mse_loss(z, q.detach())
            return self.decoder(z + (q - z).detach()), vq

    torch.manual_seed(0)
    prototypes = torch.randn(16, 24)
    model = VQVAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    x_val = prototypes[torch.randint(0, 16, (256,))] + 0.1 * torch.randn(256, 24)
    held_out: list[float] = []
    with observe(model):
        for _ in range(250):
            x = prototypes[torch.randint(0, 16, (64,))] + 0.1 * torch.randn(64, 24)
            recon, vq = model(x)
            loss = F.mse_loss(recon, x) + vq
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                held_out.append(F.mse_loss(model(x_val)[0], x_val).item())
    return held_out


def super_convergence_onecycle(observe: Observe) -> list[float]:
    """fast.ai-style super-convergence: a BatchNorm CNN under SGD with OneCycleLR to a peak of 1.0 (momentum cycled
    0.95 -> 0.85), weight decay 5e-4."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 4),
    )
    patterns = torch.randn(4, 1, 12, 12)
    steps = 120
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1.0, total_steps=steps)
    losses: list[float] = []
    with observe(model):
        for _ in range(steps):
            y = torch.randint(0, 4, (64,))
            x = patterns[y] + torch.randn(64, 1, 12, 12)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
    return losses


def discriminative_lr_finetuning(observe: Observe) -> list[float]:
    """Fine-tuning a pretrained backbone with discriminative learning rates: AdamW param groups of 1e-5 for the
    backbone and 2e-3 for a new head, as in BERT / ULMFiT recipes."""
    backbone, w = _pretrained_backbone(2)
    model = nn.Sequential(backbone, nn.Linear(64, 5))
    optimizer = torch.optim.AdamW(
        [{"params": model[0].parameters(), "lr": 1e-5}, {"params": model[1].parameters(), "lr": 2e-3}],
        weight_decay=0.01,
    )
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            x = torch.randn(64, 20)
            loss = F.cross_entropy(model(x), (x @ w[:, 3:]).argmax(dim=1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def gradual_unfreezing(observe: Observe) -> list[float]:
    """ULMFiT-style gradual unfreezing: all parameters in the optimizer, the backbone's layers frozen with
    requires_grad False at first and unfrozen one at a time, from the top, every 40 steps."""
    backbone, w = _pretrained_backbone(3)
    model = nn.Sequential(backbone, nn.Linear(64, 4))
    model[0].requires_grad_(False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []
    with observe(model):
        for step in range(160):
            if step == 40:
                model[0][2].requires_grad_(True)
            if step == 80:
                model[0][0].requires_grad_(True)
            x = torch.randn(64, 20)
            loss = F.cross_entropy(model(x), ((x @ w[:, :4]) * torch.tensor([1.0, -1.0, 1.0, -1.0])).argmax(dim=1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def stochastic_depth(observe: Observe) -> list[float]:
    """Residual MLP blocks with stochastic depth: in training each block is skipped for the whole batch with
    probability 0.3 (its parameters get no gradient on those steps), survivors scaled by 1 / 0.7."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.training and float(torch.rand(())) < 0.3:
                return x
            return x + self.body(x) / (0.7 if self.training else 1.0)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), *(Block() for _ in range(4)), nn.LayerNorm(32), nn.Linear(32, 1))
    w = torch.randn(16, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            x = torch.randn(64, 16)
            loss = F.mse_loss(model(x), torch.tanh(x @ w))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def ddpm_denoiser(observe: Observe) -> list[float]:
    """A DDPM on 2-D points: a 200-step linear beta schedule, a noise-prediction MLP with a sinusoidal timestep
    embedding, the simple MSE between the true and the predicted noise at a random timestep."""

    class Denoiser(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(2 + 16, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 2))

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            freqs = torch.exp(-math.log(1000) * torch.arange(8) / 8)
            angles = t.float().unsqueeze(1) * freqs
            return self.net(torch.cat([x, angles.sin(), angles.cos()], dim=1))

    torch.manual_seed(0)
    betas = torch.linspace(1e-4, 0.05, 200)
    alpha_bar = torch.cumprod(1 - betas, dim=0)
    centres = torch.tensor([[1.0, 1.0], [-1.0, 1.0], [0.0, -1.0]])
    model = Denoiser()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            x0 = centres[torch.randint(0, 3, (128,))] + 0.05 * torch.randn(128, 2)
            t = torch.randint(0, 200, (128,))
            noise = torch.randn_like(x0)
            a = alpha_bar[t].unsqueeze(1)
            loss = F.mse_loss(model(a.sqrt() * x0 + (1 - a).sqrt() * noise, t), noise)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def cyclic_lr(observe: Observe) -> list[float]:
    """SGD under CyclicLR (triangular, 1e-3 to 0.1, 20 steps up and 20 down), a BatchNorm MLP classifier."""
    torch.manual_seed(0)
    w = torch.randn(20, 5)
    model = nn.Sequential(nn.Linear(20, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CyclicLR(optimizer, base_lr=1e-3, max_lr=0.1, step_size_up=20)
    losses: list[float] = []
    with observe(model):
        for _ in range(160):
            x = torch.randn(64, 20)
            loss = F.cross_entropy(model(x), (x @ w).argmax(dim=1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
    return losses


def sgdr_warm_restarts(observe: Observe) -> list[float]:
    """SGDR: CosineAnnealingWarmRestarts (T_0 25, T_mult 2), the learning rate jumping back to 0.2 at each
    restart, SGD with momentum on a small CNN."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 4),
    )
    patterns = torch.randn(4, 1, 12, 12)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=25, T_mult=2)
    losses: list[float] = []
    with observe(model):
        for _ in range(175):
            y = torch.randint(0, 4, (32,))
            x = patterns[y] + torch.randn(32, 1, 12, 12)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
    return losses


def arcface_metric_learning(observe: Observe) -> list[float]:
    """Face-recognition style metric learning: an embedding net and an ArcFace head (normalised class centres,
    an additive angular margin of 0.5, logits scaled by s = 30), CrossEntropyLoss on the scaled cosine logits: the
    first loss is about 11 log(10) by design. The measure per step is the held-out error of the nearest centre."""

    class ArcFace(nn.Module):
        def __init__(self, dim: int, classes: int, s: float = 30.0, m: float = 0.5) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.empty(classes, dim))
            nn.init.xavier_uniform_(self.weight)
            self.s, self.m = s, m

        def forward(self, emb: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            cosine = F.linear(F.normalize(emb), F.normalize(self.weight)).clamp(-1 + 1e-7, 1 - 1e-7)
            # past pi - m, cos(theta + m) rises again: the reference code falls back to cos(theta) - m sin(m)
            target = torch.where(
                cosine > math.cos(math.pi - self.m),
                torch.cos(torch.acos(cosine) + self.m),
                cosine - math.sin(math.pi - self.m) * self.m,
            )
            one_hot = F.one_hot(labels, cosine.size(1)).bool()
            return self.s * torch.where(one_hot, target, cosine)

    torch.manual_seed(0)
    centres = torch.randn(10, 32)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedder = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 16))
            self.head = ArcFace(16, 10)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return self.head(self.embedder(x), labels)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    y_val = torch.randint(0, 10, (256,))
    x_val = centres[y_val] + 0.5 * torch.randn(256, 32)
    errors: list[float] = []
    with observe(model):
        for _ in range(150):
            y = torch.randint(0, 10, (64,))
            x = centres[y] + 0.5 * torch.randn(64, 32)
            loss = F.cross_entropy(model(x, y), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            model.eval()
            with torch.no_grad():
                nearest = (F.normalize(model.embedder(x_val)) @ F.normalize(model.head.weight).T).argmax(dim=1)
                errors.append(float((nearest != y_val).float().mean()))
            model.train()
    return errors


def packed_lstm_classifier(observe: Observe) -> list[float]:
    """Variable-length sequence classification: padded token batches, pack_padded_sequence into an LSTM, the
    final hidden state of each sequence to a Linear head."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(12, 16, padding_idx=0)
            self.lstm = nn.LSTM(16, 32, batch_first=True)
            self.fc = nn.Linear(32, 3)

        def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            packed = nn.utils.rnn.pack_padded_sequence(
                self.embed(tokens), lengths, batch_first=True, enforce_sorted=False
            )
            _, (h, _) = self.lstm(packed)
            return self.fc(h[-1])

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(120):
            lengths = torch.randint(3, 13, (32,))
            tokens = torch.randint(1, 12, (32, 12))
            tokens[torch.arange(12) >= lengths.unsqueeze(1)] = 0
            y = ((tokens >= 1) & (tokens <= 3)).sum(1).clamp(max=2)  # how many of tokens 1-3: 0, 1, 2 or more
            loss = F.cross_entropy(model(tokens, lengths), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def magnitude_pruning(observe: Observe) -> list[float]:
    """Training after magnitude pruning: torch.nn.utils.prune.l1_unstructured removes 60 % of each hidden Linear's
    weights (``weight_orig`` times a fixed ``weight_mask`` in a forward pre-hook), then the sparse net is trained."""
    from torch.nn.utils import prune

    torch.manual_seed(0)
    w = torch.randn(20, 4)
    model = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))
    for layer in (model[0], model[2]):
        prune.l1_unstructured(layer, name="weight", amount=0.6)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            x = torch.randn(64, 20)
            loss = F.cross_entropy(model(x), (x @ w).argmax(dim=1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def gaussian_nll_regression(observe: Observe) -> list[float]:
    """Heteroscedastic regression: a net predicting a mean and a log-variance, nn.GaussianNLLLoss, whose value
    goes below zero as the predicted variances shrink; the measure per step is the held-out MSE of the mean."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    criterion = nn.GaussianNLLLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    def data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.rand(n, 1) * 4 - 2
        return x, torch.sin(2 * x) + 0.05 * (1 + x.abs()) * torch.randn(n, 1)

    x_val, y_val = data(256)
    held_out: list[float] = []
    with observe(model):
        for _ in range(250):
            x, y = data(128)
            mean, log_var = model(x).chunk(2, dim=1)
            loss = criterion(mean, y, log_var.exp())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                held_out.append(F.mse_loss(model(x_val)[:, :1], y_val).item())
    return held_out


#: Parameters that stay where they started by construction, per program: a Wasserstein critic's output bias adds
#: the same constant to the real and the fake scores, so its gradient is exactly zero (the reference WGAN-GP
#: critics keep it all the same).
STILL: dict[str, list[str]] = {"wgan_gp": ["1/4.bias"]}

PROGRAMS: dict[str, Callable[[Observe], list[float]]] = {
    "triplet_metric_learning": triplet_metric_learning,
    "realnvp_flow": realnvp_flow,
    "wgan_gp": wgan_gp,
    "spectral_norm_gan": spectral_norm_gan,
    "physics_informed_net": physics_informed_net,
    "nerf_positional_encoding": nerf_positional_encoding,
    "frozen_backbone_new_head": frozen_backbone_new_head,
    "lora_finetuning": lora_finetuning,
    "mean_teacher_ema": mean_teacher_ema,
    "byol": byol,
    "onecycle_transformer": onecycle_transformer,
    "warmup_cosine_sgd": warmup_cosine_sgd,
    "focal_loss_imbalanced": focal_loss_imbalanced,
    "mixup_label_smoothing": mixup_label_smoothing,
    "multitask_two_heads": multitask_two_heads,
    "poisson_regression": poisson_regression,
    "quantile_regression": quantile_regression,
    "mobilenet_depthwise": mobilenet_depthwise,
    "bahdanau_seq2seq": bahdanau_seq2seq,
    "clip_contrastive": clip_contrastive,
    "fast_adversarial_training": fast_adversarial_training,
    "sharpness_aware_minimisation": sharpness_aware_minimisation,
    "vae_kl_annealing": vae_kl_annealing,
    "multilabel_sigmoid_bce": multilabel_sigmoid_bce,
    "hf_linear_warmup": hf_linear_warmup,
    "swa_ema_averaged_model": swa_ema_averaged_model,
    "sparse_autoencoder": sparse_autoencoder,
    "domain_adversarial": domain_adversarial,
    "squeeze_excitation": squeeze_excitation,
    "vq_vae": vq_vae,
    "super_convergence_onecycle": super_convergence_onecycle,
    "discriminative_lr_finetuning": discriminative_lr_finetuning,
    "gradual_unfreezing": gradual_unfreezing,
    "stochastic_depth": stochastic_depth,
    "ddpm_denoiser": ddpm_denoiser,
    "cyclic_lr": cyclic_lr,
    "sgdr_warm_restarts": sgdr_warm_restarts,
    "arcface_metric_learning": arcface_metric_learning,
    "packed_lstm_classifier": packed_lstm_classifier,
    "magnitude_pruning": magnitude_pruning,
    "gaussian_nll_regression": gaussian_nll_regression,
}
