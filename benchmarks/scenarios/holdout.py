"""Held-out scenarios: training runs written the way users write them, never used to calibrate the engine.

They measure how well the diagnosis generalises beyond the calibration library: other architectures (VGG with
max-pooling, a U-Net, 1-D audio convolutions, recurrent language models, pre-norm attention blocks written by
hand, GANs, multi-task and siamese models, depthwise-separable convolutions), other optimizers and loops
(RMSprop, Adagrad, Nesterov SGD, AdamW, schedulers, gradient clipping and accumulation, bf16 autocast,
validation passes in eval mode), and faults planted the way they happen in real code.

One exception to "never used to calibrate": ``holdout_grads_zeroed_per_epoch_gru`` was written by the engine's
authors after the engine gained ``gradients_not_zeroed`` (the set needs every kind on two model classes), so it is
not blind; ``holdout_exploding_grads_never_zeroed_unet`` was written blind and only relabelled then (its fault is the
missing zero_grad, its explosion an accepted effect).

Each ground truth was checked with plain torch by ``python -m benchmarks.holdout_evidence``. Where a loop
clips gradients, its probe sees the gradients as ``backward()`` left them, before clipping.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import _common as c
from .base import Batch, Run, Scenario, StepProbe

BatchFn = Callable[[int], Batch]

# A fully dead layer passes exactly zero gradient upstream: the layers before it stop moving.
_DEAD_SIDE_EFFECTS = ("vanishing_gradients", "stalled_updates")


# ----------------------------------------------------------------------------------------------------- data


def _rng(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def pattern_images(classes: int, size: int, batch_size: int, seed: int, *, channels: int = 3) -> BatchFn:
    """Images of smooth per-class patterns with a random contrast, under heavy pixel noise."""
    coarse = torch.randn(classes, channels, 4, 4, generator=c.generator(seed))
    templates = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)

    def batch(step: int) -> Batch:
        g = _rng(seed, step)
        y = torch.randint(0, classes, (batch_size,), generator=g)
        contrast = 0.5 + torch.rand(batch_size, 1, 1, 1, generator=g)
        x = contrast * templates[y] + 0.8 * torch.randn(batch_size, channels, size, size, generator=g)
        return x, y

    return batch


def noisy_images(size: int, batch_size: int, seed: int, *, noise: float = 0.5) -> BatchFn:
    """Denoising pairs: smooth single-channel images plus Gaussian noise (input) and the clean image (target)."""

    def batch(step: int) -> Batch:
        g = _rng(seed, step)
        coarse = torch.randn(batch_size, 1, 4, 4, generator=g)
        clean = F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False)
        return clean + noise * torch.randn(clean.shape, generator=g), clean

    return batch


def tones(classes: int, length: int, batch_size: int, seed: int, *, silent_at: int | None = None) -> BatchFn:
    """Mono clips (batch, 1, length): a sine whose frequency is the class, a random phase and gain, and noise.

    ``silent_at``: at that step one clip of the batch is all zeros (a padding segment that slipped through).
    """
    cycles = torch.tensor([3.0 + 4.0 * k for k in range(classes)])
    t = torch.arange(length, dtype=torch.float32) / length

    def batch(step: int) -> Batch:
        g = _rng(seed, step)
        y = torch.randint(0, classes, (batch_size,), generator=g)
        phase = 2 * math.pi * torch.rand(batch_size, 1, generator=g)
        gain = 0.5 + torch.rand(batch_size, 1, generator=g)
        x = gain * torch.sin(2 * math.pi * cycles[y][:, None] * t + phase)
        x = x + 0.3 * torch.randn(batch_size, length, generator=g)
        if step == silent_at:
            x[3] = 0.0
        return x[:, None, :], y

    return batch


def markov_text(vocab: int, length: int, batch_size: int, seed: int) -> BatchFn:
    """Token sequences from a fixed sparse Markov chain; the target is the next token (language modelling)."""
    successors = torch.randint(0, vocab, (vocab, 3), generator=c.generator(seed))

    def batch(step: int) -> Batch:
        g = _rng(seed, step)
        seq = torch.empty(batch_size, length + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, vocab, (batch_size,), generator=g)
        for i in range(length):
            pick = torch.randint(0, 3, (batch_size,), generator=g)
            seq[:, i + 1] = successors[seq[:, i], pick]
        return seq[:, :-1], seq[:, 1:]

    return batch


def majority_tokens(vocab: int, length: int, classes: int, batch_size: int, seed: int) -> BatchFn:
    """Token sequences whose label is the token group (token % classes) that occurs most often."""

    def batch(step: int) -> Batch:
        g = _rng(seed, step)
        favoured = torch.randint(0, classes, (batch_size, 1), generator=g)
        tokens = torch.randint(0, vocab, (batch_size, length), generator=g)
        bias = torch.rand(batch_size, length, generator=g) < 0.4
        shifted = tokens - tokens % classes + favoured
        tokens = torch.where(bias, shifted.clamp(max=vocab - 1), tokens)
        counts = F.one_hot(tokens % classes, classes).sum(dim=1)
        return tokens, counts.argmax(dim=1)

    return batch


def multitask(in_dim: int, classes: int, batch_size: int, seed: int, *, nan_label_at: int | None = None) -> BatchFn:
    """Inputs ~ N(0, 1); targets (batch, 2): a class index (as float) and a smooth regression value.

    ``nan_label_at``: at that step two regression labels are NaN (missing values never filtered out).
    """
    g = c.generator(seed)
    w = torch.randn(in_dim, classes, generator=g)
    u = torch.randn(in_dim, generator=g) / math.sqrt(in_dim)

    def batch(step: int) -> Batch:
        x = torch.randn(batch_size, in_dim, generator=_rng(seed, step))
        y = torch.stack([(x @ w).argmax(dim=1).float(), torch.sin(2.0 * x @ u)], dim=1)
        if step == nan_label_at:
            y[5:7, 1] = float("nan")
        return x, y

    return batch


def gaussian_2d(noise_dim: int, batch_size: int, seed: int) -> BatchFn:
    """GAN data: latent noise (input) and samples of a correlated, shifted 2-D Gaussian (target)."""
    mean = torch.tensor([2.0, -1.0])
    chol = torch.tensor([[0.6, 0.0], [0.45, 0.3]])

    def batch(step: int) -> Batch:
        g = _rng(seed, step)
        z = torch.randn(batch_size, noise_dim, generator=g)
        real = mean + torch.randn(batch_size, 2, generator=g) @ chol.T
        return z, real

    return batch


def pairs(dim: int, identities: int, batch_size: int, seed: int) -> BatchFn:
    """Siamese data: (batch, 2, dim) pairs of noisy views of identity prototypes; target 1.0 when same."""
    prototypes = torch.randn(identities, dim, generator=c.generator(seed))

    def batch(step: int) -> Batch:
        g = _rng(seed, step)
        a = torch.randint(0, identities, (batch_size,), generator=g)
        same = torch.rand(batch_size, generator=g) < 0.5
        other = (a + torch.randint(1, identities, (batch_size,), generator=g)) % identities
        b = torch.where(same, a, other)
        x = torch.stack([prototypes[a], prototypes[b]], dim=1)
        return x + 0.6 * torch.randn(x.shape, generator=g), same.float()

    return batch


# --------------------------------------------------------------------------------------------------- models


class VGGNet(nn.Module):
    """VGG-style (CIFAR variant): 3x3 conv stacks with in-place ReLUs and max-pooling, a linear classifier."""

    def __init__(self, classes: int = 4, width: int = 16, *, batch_norm: bool = False, bn_momentum: float = 0.1):
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for cout, convs in ((width, 2), (2 * width, 2), (4 * width, 1)):
            for _ in range(convs):
                layers.append(nn.Conv2d(cin, cout, 3, padding=1, bias=not batch_norm))
                if batch_norm:
                    layers.append(nn.BatchNorm2d(cout, momentum=bn_momentum))
                layers.append(nn.ReLU(inplace=True))
                cin = cout
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(4 * width * 2 * 2, classes))
        for m in self.modules():  # torchvision's VGG initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class TinyUNet(nn.Module):
    """A two-level U-Net: conv encoder, max-pool, bottleneck, transposed-conv upsampling and a skip concat."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1))
        self.act1 = nn.ReLU()
        self.down = nn.MaxPool2d(2)
        self.enc2 = nn.Sequential(
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.Conv2d(2 * width, 2 * width, 3, padding=1)
        )
        self.act2 = nn.ReLU()
        self.up = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv2d(2 * width, width, 3, padding=1), nn.ReLU())
        self.out = nn.Conv2d(width, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.act1(self.enc1(x))
        e2 = self.act2(self.enc2(self.down(e1)))
        return self.out(self.dec(torch.cat([self.up(e2), e1], dim=1)))


class ClipRMSNorm(nn.Module):
    """Normalises every clip to unit RMS loudness (no epsilon: 'clips are never silent')."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.pow(2).mean(dim=(1, 2), keepdim=True).sqrt()


class AudioNet(nn.Module):
    """1-D conv audio classifier: three strided Conv1d stages, global average pooling, a linear head."""

    def __init__(self, classes: int = 4, width: int = 16, act: type[nn.Module] = nn.ReLU, *, norm: bool = False):
        super().__init__()
        self.norm = ClipRMSNorm() if norm else nn.Identity()
        self.conv1 = nn.Conv1d(1, width, 9, stride=2, padding=4)
        self.act1 = act()
        self.conv2 = nn.Conv1d(width, 2 * width, 9, stride=2, padding=4)
        self.act2 = act()
        self.conv3 = nn.Conv1d(2 * width, 2 * width, 9, stride=2, padding=4)
        self.act3 = act()
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act1(self.conv1(self.norm(x)))
        x = self.act2(self.conv2(x))
        x = self.act3(self.conv3(x))
        return self.fc(self.pool(x).flatten(1))


class RecurrentLM(nn.Module):
    """Embedding, a one-layer GRU or LSTM, and a decoder to vocabulary logits at every position."""

    def __init__(self, vocab: int, emb: int = 32, hidden: int = 64, *, cell: str = "gru") -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.rnn = (nn.GRU if cell == "gru" else nn.LSTM)(emb, hidden, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.decoder(out)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class PreNormBlock(nn.Module):
    """A hand-written pre-norm transformer block around nn.MultiheadAttention."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        attended, _ = self.attn(h, h, h, need_weights=False)
        x = x + attended
        return x + self.ff(self.norm2(x))


class TokenClassifier(nn.Module):
    """Token and position embeddings, pre-norm blocks, a final LayerNorm, mean pooling and a linear head."""

    def __init__(self, vocab: int, length: int, classes: int, dim: int = 32, depth: int = 2, heads: int = 4):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(length, dim)
        self.blocks = nn.ModuleList(PreNormBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


class MultiTaskNet(nn.Module):
    """A shared ReLU trunk with a classification head and a regression head."""

    def __init__(self, in_dim: int = 16, hidden: int = 64, classes: int = 3, dropout: float = 0.0) -> None:
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Linear(in_dim, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
        )
        self.cls_head = nn.Linear(hidden, classes)
        self.reg_head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return self.cls_head(h), self.reg_head(h).squeeze(-1)


def multitask_loss(out: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    logits, value = out
    return F.cross_entropy(logits, target[:, 0].long()) + F.mse_loss(value, target[:, 1])


class LazyScale(nn.Module):
    """A learned per-feature output scale, created on the first call, when the width is known."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, "weight"):
            self.weight = nn.Parameter(torch.ones(x.shape[-1]))
        return x * self.weight


class FeatureMixer(nn.Module):
    """An MLP kept in an nn.ModuleDict, with functional GELU, SiLU and tanh between the layers."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, *, lazy_scale: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleDict(
            {
                "stem": nn.Linear(in_dim, hidden),
                "mix": nn.Linear(hidden, hidden),
                "proj": nn.Linear(hidden, hidden),
                "out": nn.Linear(hidden, out_dim),
            }
        )
        if lazy_scale:
            self.layers["scale"] = LazyScale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.layers["stem"](x))
        h = h + F.silu(self.layers["mix"](h))
        h = torch.tanh(self.layers["proj"](h))
        if "scale" in self.layers:
            h = self.layers["scale"](h)
        return self.layers["out"](h)


class DeepSigmoidNet(nn.Module):
    """A deep plain MLP in an nn.ModuleList with functional sigmoids, as in old tutorials."""

    def __init__(self, in_dim: int, width: int, depth: int, out_dim: int) -> None:
        super().__init__()
        sizes = [in_dim] + [width] * depth
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))
        self.out = nn.Linear(width, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = torch.sigmoid(layer(x))
        return self.out(x)


class SeparableConv(nn.Module):
    """Depthwise 3x3 conv, pointwise 1x1 conv, BatchNorm, ReLU (MobileNet v1 style)."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False)
        self.pointwise = nn.Conv2d(cin, cout, 1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.pointwise(self.depthwise(x))))


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation channel gate; the gate logits are divided by a temperature."""

    def __init__(self, channels: int, reduction: int = 4, temperature: float = 1.0) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(channels, channels // reduction)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(channels // reduction, channels)
        self.gate = nn.Sigmoid()
        self.temperature = temperature

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.pool(x).flatten(1)
        s = self.gate(self.fc2(self.act(self.fc1(s))) / self.temperature)
        return x * s[:, :, None, None]


class SeparableNet(nn.Module):
    """A MobileNet-like classifier: conv stem, depthwise-separable stages, optional SE gate, pooled head."""

    def __init__(self, classes: int = 4, width: int = 16, *, se_temperature: float | None = None) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.stages = nn.Sequential(SeparableConv(width, 2 * width, stride=2), SeparableConv(2 * width, 4 * width, 2))
        self.se = SqueezeExcite(4 * width, temperature=se_temperature) if se_temperature else nn.Identity()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.se(self.stages(self.stem(x)))).flatten(1))


class Generator(nn.Module):
    def __init__(self, noise_dim: int = 8, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(noise_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2)
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Linear(2, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden), nn.LeakyReLU(0.2)
        )
        self.classify = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(x))


class GAN(nn.Module):
    """Generator and discriminator in one module; calling it samples from the generator."""

    def __init__(self, noise_dim: int = 8) -> None:
        super().__init__()
        self.generator = Generator(noise_dim)
        self.discriminator = Discriminator()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.generator(z)


class SiameseEncoder(nn.Module):
    def __init__(self, in_dim: int = 32, hidden: int = 64, out_dim: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.act2 = nn.ReLU()
        self.embed = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(self.act2(self.fc2(self.act1(self.fc1(x)))))


class SparseAutoencoder(nn.Module):
    """A wide ReLU code layer with a linear decoder; the code is kept for the L1 sparsity penalty."""

    def __init__(self, dim: int = 32, code: int = 128) -> None:
        super().__init__()
        self.encoder = nn.Linear(dim, code)
        self.code_act = nn.ReLU()
        self.decoder = nn.Linear(code, dim)
        self.code: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.code = self.code_act(self.encoder(x))
        return self.decoder(self.code)


class BasicBlock(nn.Module):
    """ResNet basic block whose last BatchNorm starts at zero (Goyal et al.): the block starts as identity."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        nn.init.zeros_(self.bn2.weight)
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu2(x + self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x))))))


class ZeroInitResNet(nn.Module):
    def __init__(self, classes: int = 4, width: int = 16, blocks: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layer = nn.Sequential(*(BasicBlock(width) for _ in range(blocks)))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.layer(self.stem(x))).flatten(1))


class PretrainedEmbeddingGRU(nn.Module):
    """Frozen 'pretrained' word vectors, a trainable GRU and a linear head on the last state."""

    def __init__(self, vectors: torch.Tensor, hidden: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(vectors, freeze=True)
        self.rnn = nn.GRU(vectors.shape[1], hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, h = self.rnn(self.embed(tokens))
        return self.head(h[-1])


# ---------------------------------------------------------------------------------------------------- loops


def _report(probe: StepProbe | None, step: int, model: nn.Module, loss: torch.Tensor) -> None:
    if probe is not None:
        probe(step, model, loss.detach())


def clipped_loop(max_norm: float) -> c.Loop:
    """loss.backward(); clip_grad_norm_(model.parameters(), max_norm); optimizer.step()."""

    def loop(run: Run, probe: StepProbe | None) -> None:
        opt = run.optimizers[0]
        for step in range(run.steps):
            inputs, targets = run.batch(step)
            opt.zero_grad()
            loss = run.loss_fn(run.model(inputs), targets)
            loss.backward()
            _report(probe, step, run.model, loss)
            nn.utils.clip_grad_norm_(run.model.parameters(), max_norm)
            opt.step()

    return loop


def validated_loop(every: int, val_batch: Batch, *, scheduler: str | None = None) -> c.Loop:
    """Train; every ``every`` steps switch to eval mode for a validation pass under no_grad, then back.

    ``scheduler="cosine"`` anneals the lr over the run (stepped per batch).
    """

    def loop(run: Run, probe: StepProbe | None) -> None:
        opt = run.optimizers[0]
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=run.steps) if scheduler == "cosine" else None
        model = run.model
        model.train()
        for step in range(run.steps):
            inputs, targets = run.batch(step)
            opt.zero_grad(set_to_none=True)
            loss = run.loss_fn(model(inputs), targets)
            loss.backward()
            _report(probe, step, model, loss)
            opt.step()
            if sched is not None:
                sched.step()
            if step % every == every - 1:
                model.eval()
                with torch.no_grad():
                    model.val_losses.append(run.loss_fn(model(val_batch[0]), val_batch[1]).item())
                model.train()

    return loop


def autocast_loop(run: Run, probe: StepProbe | None) -> None:
    """Forward and loss under torch.autocast('cpu', dtype=torch.bfloat16); backward and step outside it."""
    opt = run.optimizers[0]
    for step in range(run.steps):
        inputs, targets = run.batch(step)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = run.loss_fn(run.model(inputs), targets)
        loss.backward()
        _report(probe, step, run.model, loss)
        opt.step()


def accumulate_keep_grads_loop(micro_batches: int) -> c.Loop:
    """Gradient accumulation over micro-batches, clearing gradients with zero_grad(set_to_none=False)."""

    def loop(run: Run, probe: StepProbe | None) -> None:
        opt = run.optimizers[0]
        for step in range(run.steps):
            inputs, targets = run.batch(step)
            opt.zero_grad(set_to_none=False)
            total = torch.zeros(())
            for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)):
                loss = run.loss_fn(run.model(x), y) / micro_batches
                loss.backward()
                total += loss.detach()
            _report(probe, step, run.model, total)
            opt.step()

    return loop


def per_batch_scheduler_loop(make: Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]) -> c.Loop:
    def loop(run: Run, probe: StepProbe | None) -> None:
        opt = run.optimizers[0]
        sched = make(opt)
        for step in range(run.steps):
            inputs, targets = run.batch(step)
            opt.zero_grad()
            loss = run.loss_fn(run.model(inputs), targets)
            loss.backward()
            _report(probe, step, run.model, loss)
            opt.step()
            sched.step()

    return loop


def siamese_loop(margin: float, *, phase_two: tuple[int, float] | None = None) -> c.Loop:
    """Contrastive loss (Hadsell et al. 2006): the encoder is called once per side of each pair.

    ``phase_two=(step, lr)``: from that step on, every parameter group's lr is set to ``lr``.
    """

    def loop(run: Run, probe: StepProbe | None) -> None:
        opt = run.optimizers[0]
        for step in range(run.steps):
            if phase_two is not None and step == phase_two[0]:
                for group in opt.param_groups:
                    group["lr"] = phase_two[1]
            x, same = run.batch(step)
            opt.zero_grad()
            d = F.pairwise_distance(run.model(x[:, 0]), run.model(x[:, 1]))
            loss = (same * d.pow(2) + (1 - same) * F.relu(margin - d).pow(2)).mean()
            loss.backward()
            _report(probe, step, run.model, loss)
            opt.step()

    return loop


def sparse_autoencoder_loop(l1: float) -> c.Loop:
    """Reconstruction MSE plus an L1 penalty on the code."""

    def loop(run: Run, probe: StepProbe | None) -> None:
        opt = run.optimizers[0]
        model = run.model
        for step in range(run.steps):
            x, _ = run.batch(step)
            opt.zero_grad()
            loss = F.mse_loss(model(x), x) + l1 * model.code.abs().mean()
            loss.backward()
            _report(probe, step, model, loss)
            opt.step()

    return loop


# ------------------------------------------------------------------------------------------ faulty builds


def _dead_vgg_negative_bias() -> Run:
    torch.manual_seed(1001)
    model = VGGNet()
    nn.init.constant_(model.features[5].bias, -8.0)  # a "start closed" gate init pasted onto block 2's conv
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return Run(model, [opt], nn.CrossEntropyLoss(), pattern_images(4, 16, 32, seed=1001), steps=40)


def _dead_multitask_rmsprop() -> Run:
    torch.manual_seed(8)
    model = MultiTaskNet()
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-2, momentum=0.9)
    return Run(model, [opt], multitask_loss, multitask(16, 3, 64, seed=1002), steps=60)


def _saturated_se_gate() -> Run:
    torch.manual_seed(1003)
    model = SeparableNet(se_temperature=0.01)  # a sharpening temperature copied from a distillation config
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    return Run(model, [opt], nn.CrossEntropyLoss(), pattern_images(4, 16, 32, seed=1003), steps=40)


def _saturated_raw_pcm() -> Run:
    torch.manual_seed(1004)
    model = AudioNet(act=nn.Tanh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    clips = tones(4, 256, 32, seed=1004)

    def batch(step: int) -> Batch:
        x, y = clips(step)
        return (x * 8000.0).round(), y  # int16 PCM samples, never divided by 32768

    return Run(model, [opt], nn.CrossEntropyLoss(), batch, steps=40)


def _vanishing_deep_sigmoid_nesterov() -> Run:
    torch.manual_seed(1005)
    model = DeepSigmoidNet(24, 48, depth=8, out_dim=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.classification(24, 4, 64, seed=1005), steps=50)


def _vanishing_sigmoid_conv1d_adagrad() -> Run:
    torch.manual_seed(1006)
    layers: list[nn.Module] = []
    cin = 1
    for i in range(7):
        layers += [nn.Conv1d(cin, 16, 5, stride=2 if i < 4 else 1, padding=2), nn.Sigmoid()]
        cin = 16
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, 4))
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    return Run(model, [opt], nn.CrossEntropyLoss(), tones(4, 256, 32, seed=1006), steps=40)


def _exploding_gru_normal_init_clipped() -> Run:
    torch.manual_seed(1007)
    model = RecurrentLM(32, cell="gru")
    for name, p in model.rnn.named_parameters():
        if name.startswith("weight_hh"):
            nn.init.normal_(p)  # meant nn.init.orthogonal_(p): std 1 gives a spectral radius of ~8
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return Run(model, [opt], lm_loss, markov_text(32, 24, 16, seed=1007), steps=40, loop=clipped_loop(1.0))


def _exploding_steplr_gamma() -> Run:
    torch.manual_seed(1008)
    model = VGGNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)

    def schedule(o: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        return torch.optim.lr_scheduler.StepLR(o, step_size=15, gamma=10.0)  # meant gamma=0.1

    return Run(
        model,
        [opt],
        nn.CrossEntropyLoss(),
        pattern_images(4, 16, 32, seed=1008),
        steps=50,
        loop=per_batch_scheduler_loop(schedule),
    )


SILENT_STEP = 23
VALIDATION_STEP = 1_000_000  # the validation batch: a step index no run trains on


def _nonfinite_silent_clip() -> Run:
    torch.manual_seed(1009)
    model = AudioNet(norm=True)
    model.val_losses = []
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    val = tones(4, 256, 64, seed=1009)(VALIDATION_STEP)
    batches = tones(4, 256, 32, seed=1009, silent_at=SILENT_STEP)
    return Run(model, [opt], nn.CrossEntropyLoss(), batches, steps=40, loop=validated_loop(10, val))


NAN_LABEL_STEP = 31


def _nonfinite_nan_labels() -> Run:
    torch.manual_seed(1010)
    model = MultiTaskNet()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return Run(model, [opt], multitask_loss, multitask(16, 3, 64, seed=1010, nan_label_at=NAN_LABEL_STEP), steps=50)


def _frozen_lazy_scale() -> Run:
    torch.manual_seed(1011)
    model = FeatureMixer(20, 64, 4, lazy_scale=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    batches = c.classification(20, 4, 64, seed=1011)
    with torch.no_grad():  # a shape check before training creates layers.scale.weight, after the optimizer
        out = model(batches(0)[0])
    if out.shape != (64, 4):
        raise RuntimeError(f"unexpected output shape {tuple(out.shape)}")
    return Run(model, [opt], nn.CrossEntropyLoss(), batches, steps=40)


def _frozen_unfrozen_after_optimizer() -> Run:
    torch.manual_seed(1012)
    model = TokenClassifier(40, 12, 3)
    model.requires_grad_(False)
    model.head.requires_grad_(True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    model.blocks[-1].requires_grad_(True)  # "also fine-tune the last block", one line too late
    return Run(model, [opt], nn.CrossEntropyLoss(), majority_tokens(40, 12, 3, 32, seed=1012), steps=40)


def gan_generator_loop(disc: Discriminator, opt_d: torch.optim.Optimizer) -> c.Loop:
    """A standard GAN loop (non-saturating loss) watched through its generator; the discriminator and its
    optimizer live in the loop's closure."""

    def loop(run: Run, probe: StepProbe | None) -> None:
        gen = run.model
        opt_g = run.optimizers[0]
        sched_g = torch.optim.lr_scheduler.ExponentialLR(opt_g, gamma=0.1)  # meant per epoch, stepped per batch
        for step in range(run.steps):
            z, real = run.batch(step)
            fake = gen(z)
            opt_d.zero_grad()
            d_loss = F.binary_cross_entropy_with_logits(
                disc(real), torch.ones(len(real), 1)
            ) + F.binary_cross_entropy_with_logits(disc(fake.detach()), torch.zeros(len(z), 1))
            d_loss.backward()
            opt_d.step()
            opt_g.zero_grad()
            g_loss = F.binary_cross_entropy_with_logits(disc(fake), torch.ones(len(z), 1))
            g_loss.backward()
            _report(probe, step, gen, g_loss)
            opt_g.step()
            sched_g.step()

    return loop


def _stalled_gan_generator() -> Run:
    torch.manual_seed(1013)
    gen = Generator()
    disc = Discriminator()
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3, betas=(0.5, 0.999))
    return Run(
        gen,
        [opt_g],
        F.binary_cross_entropy_with_logits,
        gaussian_2d(8, 64, seed=1013),
        steps=40,
        loop=gan_generator_loop(disc, opt_d),
    )


DATASET_SIZE = 50_000


def _stalled_loss_over_dataset_size() -> Run:
    torch.manual_seed(1014)
    model = SeparableNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)

    def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, y) / DATASET_SIZE  # "average over the dataset", on a mean loss

    return Run(model, [opt], loss_fn, pattern_images(4, 16, 32, seed=1014), steps=40)


def _dead_siamese_lr_jump() -> Run:
    torch.manual_seed(1015)
    model = SiameseEncoder()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return Run(
        model, [opt], F.mse_loss, pairs(32, 10, 64, seed=1015), steps=60, loop=siamese_loop(2.0, phase_two=(30, 0.3))
    )


def never_zeroed_loop(run: Run, probe: StepProbe | None) -> None:
    """A loop whose optimizer.zero_grad() sits before the loop instead of inside it."""
    opt = run.optimizers[0]
    opt.zero_grad()
    for step in range(run.steps):
        inputs, targets = run.batch(step)
        loss = run.loss_fn(run.model(inputs), targets)
        loss.backward()
        _report(probe, step, run.model, loss)
        opt.step()


def _exploding_never_zeroed_unet() -> Run:
    torch.manual_seed(1016)
    model = TinyUNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return Run(model, [opt], nn.MSELoss(), noisy_images(16, 16, seed=1016), steps=40, loop=never_zeroed_loop)


def epoch_zeroed_loop(epoch: int) -> c.Loop:
    """A loop whose model.zero_grad() sits in the epoch loop: gradients are cleared every ``epoch`` steps only."""

    def loop(run: Run, probe: StepProbe | None) -> None:
        opt = run.optimizers[0]
        for step in range(run.steps):
            if step % epoch == 0:
                run.model.zero_grad()
            inputs, targets = run.batch(step)
            loss = run.loss_fn(run.model(inputs), targets)
            loss.backward()
            _report(probe, step, run.model, loss)
            opt.step()

    return loop


#: Steps per epoch of the GRU whose gradients are zeroed once per epoch.
ZEROED_EPOCH = 15


def _not_zeroed_per_batch_gru() -> Run:
    torch.manual_seed(1017)
    model = c.RecurrentClassifier(8, 32, 3, cell="gru")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return Run(
        model,
        [opt],
        nn.CrossEntropyLoss(),
        c.sequences(8, 12, 3, 32, seed=1017),
        steps=60,
        loop=epoch_zeroed_loop(ZEROED_EPOCH),
    )


# ------------------------------------------------------------------------------------------ healthy builds


def _healthy_sparse_autoencoder() -> Run:
    torch.manual_seed(1101)
    model = SparseAutoencoder()
    nn.init.constant_(model.encoder.bias, -0.5)  # start sparse
    basis = torch.randn(8, 32, generator=c.generator(1101))

    def batch(step: int) -> Batch:
        g = _rng(1101, step)
        z = torch.randn(64, 8, generator=g) * (torch.rand(64, 8, generator=g) < 0.3)
        x = z @ basis + 0.05 * torch.randn(64, 32, generator=g)
        return x, x

    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return Run(model, [opt], F.mse_loss, batch, steps=80, loop=sparse_autoencoder_loop(0.05))


def _healthy_zero_init_resnet() -> Run:
    torch.manual_seed(1102)
    model = ZeroInitResNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    return Run(model, [opt], nn.CrossEntropyLoss(), pattern_images(4, 12, 32, seed=1102), steps=40)


def _healthy_frozen_embedding_gru() -> Run:
    torch.manual_seed(1103)
    vectors = torch.randn(40, 16, generator=c.generator(1103))  # "pretrained" word vectors
    model = PretrainedEmbeddingGRU(vectors, 32, 3)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    return Run(model, [opt], nn.CrossEntropyLoss(), majority_tokens(40, 12, 3, 32, seed=1103), steps=80)


def _healthy_vgg_bn_eval() -> Run:
    torch.manual_seed(1104)
    model = VGGNet(batch_norm=True, bn_momentum=0.01)  # slow running statistics: eval outputs lag training
    model.val_losses = []
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    val = pattern_images(4, 16, 64, seed=1104)(VALIDATION_STEP)
    return Run(
        model,
        [opt],
        nn.CrossEntropyLoss(),
        pattern_images(4, 16, 32, seed=1104),
        steps=40,
        loop=validated_loop(10, val, scheduler="cosine"),
    )


def _healthy_multitask_dropout() -> Run:
    torch.manual_seed(1105)
    model = MultiTaskNet(dropout=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return Run(model, [opt], multitask_loss, multitask(16, 3, 64, seed=1105), steps=60)


def _healthy_label_smoothing_transformer() -> Run:
    torch.manual_seed(1106)
    model = TokenClassifier(40, 12, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    return Run(
        model, [opt], nn.CrossEntropyLoss(label_smoothing=0.1), majority_tokens(40, 12, 3, 32, seed=1106), steps=50
    )


def _healthy_siamese() -> Run:
    torch.manual_seed(1107)
    model = SiameseEncoder()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return Run(model, [opt], F.mse_loss, pairs(32, 10, 64, seed=1107), steps=60, loop=siamese_loop(2.0))


def _healthy_bf16_audio() -> Run:
    torch.manual_seed(1108)
    model = AudioNet()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return Run(model, [opt], nn.CrossEntropyLoss(), tones(4, 256, 32, seed=1108), steps=40, loop=autocast_loop)


def _gan_loop(run: Run, probe: StepProbe | None) -> None:
    """Alternating discriminator and generator steps; the generator uses feature matching (Salimans et al.)."""
    gan = run.model
    opt_d, opt_g = run.optimizers
    for step in range(run.steps):
        z, real = run.batch(step)
        fake = gan(z)
        opt_d.zero_grad()
        d_loss = F.binary_cross_entropy_with_logits(
            gan.discriminator(real), torch.ones(len(real), 1)
        ) + F.binary_cross_entropy_with_logits(gan.discriminator(fake.detach()), torch.zeros(len(z), 1))
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad()
        target = gan.discriminator.features(real).mean(dim=0).detach()
        g_loss = (gan.discriminator.features(fake).mean(dim=0) - target).pow(2).sum()
        g_loss.backward()
        _report(probe, step, gan, g_loss)
        opt_g.step()


def _healthy_gan() -> Run:
    torch.manual_seed(1109)
    model = GAN()
    opts: list[torch.optim.Optimizer] = [
        torch.optim.Adam(model.discriminator.parameters(), lr=1e-3, betas=(0.5, 0.999)),
        torch.optim.Adam(model.generator.parameters(), lr=2e-3, betas=(0.5, 0.999)),
    ]
    return Run(model, opts, F.mse_loss, gaussian_2d(8, 64, seed=1109), steps=60, loop=_gan_loop)


def _healthy_clipped_lstm_lm() -> Run:
    torch.manual_seed(1110)
    model = RecurrentLM(32, cell="lstm")
    opt = torch.optim.SGD(model.parameters(), lr=5.0)  # the word_language_model recipe: large lr, clip 0.25
    return Run(model, [opt], lm_loss, markov_text(32, 24, 16, seed=1110), steps=60, loop=clipped_loop(0.25))


def _healthy_unet_adamw() -> Run:
    torch.manual_seed(1111)
    model = TinyUNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    return Run(model, [opt], nn.MSELoss(), noisy_images(16, 16, seed=1111), steps=40)


def _healthy_onecycle_separable() -> Run:
    torch.manual_seed(1112)
    model = SeparableNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)

    def schedule(o: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        return torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=50, div_factor=1e4)

    return Run(
        model,
        [opt],
        nn.CrossEntropyLoss(),
        pattern_images(4, 16, 32, seed=1112),
        steps=50,
        loop=per_batch_scheduler_loop(schedule),
    )


def _healthy_small_lr_accumulation() -> Run:
    torch.manual_seed(1113)
    model = FeatureMixer(20, 64, 1)
    opt = torch.optim.Adam(model.parameters(), lr=2e-4)
    return Run(
        model, [opt], nn.MSELoss(), c.regression(20, 1, 64, seed=1113), steps=120, loop=accumulate_keep_grads_loop(4)
    )


def _healthy_frozen_after_optimizer() -> Run:
    torch.manual_seed(1115)
    model = TokenClassifier(40, 12, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for part in (model.tokens, model.positions, model.blocks[0]):  # keep the "pretrained" layers fixed
        part.requires_grad_(False)
    return Run(model, [opt], nn.CrossEntropyLoss(), majority_tokens(40, 12, 3, 32, seed=1115), steps=50)


def _healthy_fast_fir_fit() -> Run:
    torch.manual_seed(1114)
    model = nn.Sequential(nn.Conv1d(1, 8, 9, padding=4), nn.Conv1d(8, 1, 1))  # a linear FIR filter bank
    target_filter = torch.randn(1, 1, 9, generator=c.generator(1114)) / 3.0

    def batch(step: int) -> Batch:
        x = torch.randn(16, 1, 128, generator=_rng(1114, step))
        return x, F.conv1d(x, target_filter, padding=4)

    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return Run(model, [opt], nn.MSELoss(), batch, steps=60)


# ------------------------------------------------------------------------------------------------ the list

SCENARIOS: list[Scenario] = [
    Scenario(
        name="holdout_dead_vgg_negative_bias_block",
        arch="cnn",
        description="A VGG-style CNN (in-place ReLUs, max-pooling, torchvision init) whose block-2 first conv "
        "got a bias of -8 from a pasted gate init: that ReLU never fires and nothing before it learns.",
        truth=c.truth(
            ["dead_neurons"],
            may_also=_DEAD_SIDE_EFFECTS,
            roots=["features.5", "features.6"],
            onset=(0, 0),
            evidence="features.6 (the ReLU after the -8 bias) is 100% dead at every step and features.0-5 get "
            "exactly zero gradient; with that bias at 0 no ReLU is dead and the loss falls to ~0",
        ),
        build=_dead_vgg_negative_bias,
    ),
    Scenario(
        name="holdout_dead_multitask_trunk_rmsprop",
        arch="mlp",
        description="A two-head multi-task MLP (CE + MSE summed) trained with RMSprop (lr 1e-2, momentum 0.9): "
        "the first normalised steps move every weight by ~10x the lr and kill most of the trunk's second ReLU.",
        truth=c.truth(
            ["dead_neurons"],
            may_also=["vanishing_gradients"],
            roots=["trunk.3", "trunk.4"],
            onset=(0, 4),
            evidence="trunk.4 is 2% dead at step 0, 48% at step 1, >= 61% from step 2 to the end; gradients peak "
            "at ~2e2 (< 1e3); the same run with Adam(lr=1e-3) has no dead layer",
        ),
        build=_dead_multitask_rmsprop,
    ),
    Scenario(
        name="holdout_saturated_se_gate_temperature",
        arch="cnn",
        description="A depthwise-separable CNN whose squeeze-excitation gate divides its logits by a "
        "temperature of 0.01: the SE sigmoid sits at 0 or 1 from step 0.",
        truth=c.truth(
            ["saturated_activations"],
            may_also=["vanishing_gradients"],
            roots=["se", "se.fc2", "se.gate"],
            onset=(0, 0),
            evidence="se.gate has >= 82% of its outputs outside [0.0025, 0.9975] from step 0 (90% at the end); it "
            "is the only bounded activation and no ReLU is >= 50% dead",
        ),
        build=_saturated_se_gate,
    ),
    Scenario(
        name="holdout_saturated_tanh_raw_pcm_conv1d",
        arch="cnn",
        description="A Conv1d audio classifier with tanh activations fed raw int16 PCM samples (never "
        "divided by 32768): the first tanh is pinned at +-1 from step 0.",
        truth=c.truth(
            ["saturated_activations"],
            may_also=["vanishing_gradients"],
            roots=["conv1", "act1"],
            onset=(0, 0),
            evidence="act1 is 100% saturated (|tanh| > 0.995) at every step while act2 and act3 stay at 0%",
        ),
        build=_saturated_raw_pcm,
    ),
    Scenario(
        name="holdout_vanishing_deep_sigmoid_nesterov",
        arch="mlp",
        description="A 9-layer MLP in an nn.ModuleList with functional torch.sigmoid between layers, trained "
        "with Nesterov SGD: the first layers get almost no gradient.",
        truth=c.truth(
            ["vanishing_gradients"],
            may_also=["stalled_updates"],
            onset=(0, 2),
            evidence="hidden.0 / out gradient-norm ratio ~1e-7 from step 0; no functional sigmoid is ever "
            "saturated (max 0%)",
        ),
        build=_vanishing_deep_sigmoid_nesterov,
    ),
    Scenario(
        name="holdout_vanishing_sigmoid_conv1d_adagrad",
        arch="cnn",
        description="A 7-layer Conv1d audio net with nn.Sigmoid after every conv, trained with Adagrad: the "
        "backward signal shrinks ~10x per layer.",
        truth=c.truth(
            ["vanishing_gradients"],
            may_also=["stalled_updates"],
            onset=(0, 2),
            evidence="first-conv / head gradient-norm ratio ~1e-6 from step 0; no sigmoid is ever >= 50% saturated "
            "(max 27%)",
        ),
        build=_vanishing_sigmoid_conv1d_adagrad,
    ),
    Scenario(
        name="holdout_exploding_gru_lm_clipped",
        arch="rnn",
        description="A GRU language model whose recurrent weights were initialised with nn.init.normal_ "
        "(std 1) instead of orthogonal_; clip_grad_norm_(1.0) hides the blow-up from the updates.",
        truth=c.truth(
            ["exploding_gradients"],
            roots=["rnn"],
            onset=(0, 3),
            evidence="raw (pre-clip) total gradient norm 5.7e2 at step 0, then between 3.3e2 and 6.6e3 at every "
            "step, > 1e3 at half of them from step 1 (mean-reduced loss: its gradient scale is 0.05, so the "
            "threshold is the plain 1e3); the GRU's initial gain is 8.0 (decoder 0.58); updates stay <= 0.25% "
            "of the weights; with orthogonal recurrent weights the raw norm stays < 0.5",
        ),
        build=_exploding_gru_normal_init_clipped,
    ),
    Scenario(
        name="holdout_exploding_steplr_gamma_10_vgg",
        arch="cnn",
        description="A VGG-style CNN trained with SGD and StepLR(step_size=15, gamma=10), a typo for "
        "gamma=0.1: at step 15 the lr jumps from 0.02 to 0.2 and the gradients blow up within two steps.",
        truth=c.truth(
            ["exploding_gradients"],
            may_also=["non_finite", "dead_neurons"],
            onset=(15, 19),
            evidence="total gradient norm <= 4 before step 15, 1.8e2 at step 16 and 2.1e3 at step 17; ReLUs die "
            "from step 18 and a module output is NaN at step 20; at a constant lr of 0.02 nothing goes "
            "wrong",
        ),
        build=_exploding_steplr_gamma,
    ),
    Scenario(
        name="holdout_nonfinite_silent_clip_rms_norm",
        arch="cnn",
        description="A Conv1d audio classifier (AdamW, eval-mode validation every 10 steps) normalises each "
        f"clip by its RMS without an epsilon; one silent clip at step {SILENT_STEP} makes that layer emit NaN.",
        truth=c.truth(
            ["non_finite"],
            roots=["norm"],
            onset=(SILENT_STEP, SILENT_STEP),
            evidence="every input is finite; 'norm' is the first module with a NaN output, at step 23, the only "
            "step with an all-zero clip; validation passes before it are finite",
        ),
        build=_nonfinite_silent_clip,
    ),
    Scenario(
        name="holdout_nonfinite_nan_regression_labels",
        arch="mlp",
        description="A two-head multi-task MLP whose regression labels contain NaN (missing values never "
        f"filtered) in the batch of step {NAN_LABEL_STEP}: every layer output is finite, the summed loss is NaN.",
        truth=c.truth(
            ["non_finite"],
            roots=[""],
            onset=(NAN_LABEL_STEP, NAN_LABEL_STEP),
            evidence="inputs and every module output are finite at step 31; only the loss is NaN (2 NaN regression "
            "labels in that batch)",
        ),
        build=_nonfinite_nan_labels,
    ),
    Scenario(
        name="holdout_frozen_lazy_param_created_in_forward",
        arch="mlp",
        description="An nn.ModuleDict MLP (F.gelu, F.silu, torch.tanh) whose LazyScale layer creates its "
        "nn.Parameter in forward; a shape check after building AdamW creates it outside the optimizer.",
        truth=c.truth(
            ["frozen_parameters"],
            roots=["layers.scale"],
            onset=(0, 2),
            evidence="layers.scale.weight is not in AdamW's param groups and is bit-identical at every step with a "
            "non-zero gradient; every other module changes at every step",
        ),
        build=_frozen_lazy_scale,
    ),
    Scenario(
        name="holdout_frozen_block_unfrozen_after_optimizer",
        arch="transformer",
        description="Fine-tuning a pre-norm nn.MultiheadAttention classifier: the optimizer is built from the "
        "trainable head, and the last block is unfrozen one line later, so it gets gradients but never moves.",
        truth=c.truth(
            ["frozen_parameters"],
            roots=[
                "blocks.1",
                "blocks.1.norm1",
                "blocks.1.attn",
                "blocks.1.attn.out_proj",
                "blocks.1.norm2",
                "blocks.1.ff",
                "blocks.1.ff.0",
                "blocks.1.ff.2",
            ],
            onset=(0, 2),
            evidence="the six parameter modules of blocks.1 are bit-identical at every step with non-zero "
            "gradients and none of their tensors is in the optimizer; the head changes at every step",
        ),
        build=_frozen_unfrozen_after_optimizer,
    ),
    Scenario(
        name="holdout_stalled_gan_generator_exponential_lr",
        arch="mlp",
        description="A GAN watched through its generator (the discriminator lives in the loop): the "
        "generator's ExponentialLR(gamma=0.1) is stepped per batch, so its lr is ~1e-9 after six steps.",
        truth=c.truth(
            ["stalled_updates"],
            may_also=["frozen_parameters"],
            onset=(2, 6),
            evidence="the generator's update/weight ratio falls 10x per step, below 1e-5 from step 4 and exactly 0 "
            "from step 8-9, while its loss rises from 0.69 to 2.0",
        ),
        build=_stalled_gan_generator,
    ),
    Scenario(
        name="holdout_stalled_loss_over_dataset_size",
        arch="cnn",
        description="A depthwise-separable CNN trained with Nesterov SGD on a mean cross-entropy that is "
        f"divided again by the dataset size ({DATASET_SIZE}): updates are ~1e-7 of the weights.",
        truth=c.truth(
            ["stalled_updates"],
            may_also=["frozen_parameters"],
            onset=(0, 2),
            evidence="update/weight ratio ~2e-7 from step 0 and a flat loss; without the division the same run "
            "learns (last/first loss 0.05)",
        ),
        build=_stalled_loss_over_dataset_size,
    ),
    Scenario(
        name="holdout_dead_siamese_lr_jump",
        arch="mlp",
        description="A siamese contrastive encoder trained with Adam at lr 2e-3 whose loop starts a second "
        "phase at step 30 with lr 0.3 (meant 3e-4): its second ReLU layer dies within a few steps.",
        truth=c.truth(
            ["dead_neurons"],
            may_also=["vanishing_gradients"],
            roots=["fc2", "act2"],
            onset=(30, 36),
            evidence="act2 is <= 5% dead before step 30, 27% at step 31, >= 50% from step 34 and 100% at the end; "
            "gradients peak at ~50 (< 1e3); without the lr change nothing dies",
        ),
        build=_dead_siamese_lr_jump,
    ),
    Scenario(
        name="holdout_exploding_grads_never_zeroed_unet",
        arch="cnn",
        description="A U-Net denoiser trained with SGD and momentum whose optimizer.zero_grad() sits before the "
        "loop: gradients accumulate over every step, and the updates grow until the run diverges.",
        truth=c.truth(  # relabelled once the engine could name the missing zero_grad: the explosion is its effect
            ["gradients_not_zeroed"],
            may_also=["exploding_gradients", "non_finite", "dead_neurons"],
            onset=(1, 1),
            evidence="from step 1 every parameter's .grad at the start of the backward pass is exactly the gradient "
            "applied at the previous step; the stored gradient norm grows at every step (0.36 at step 0, 5.0 at "
            "step 9), exceeds 1e3 at step 28 and is NaN at step 30, ReLUs dying on the way; with zero_grad() in "
            "the loop it stays <= 2.6",
        ),
        build=_exploding_never_zeroed_unet,
    ),
    Scenario(  # written after the engine gained gradients_not_zeroed, by its authors: not blind like the rest
        name="holdout_grads_zeroed_per_epoch_gru",
        arch="rnn",
        description="A GRU sequence classifier trained with Adam whose model.zero_grad() sits in the epoch loop "
        f"(every {ZEROED_EPOCH} steps) instead of the batch loop; written after the engine knew this kind.",
        truth=c.truth(
            ["gradients_not_zeroed"],
            onset=(1, 1),
            evidence="at every step but 15, 30 and 45 (from step 1) each parameter's .grad at the start of the "
            "backward pass is exactly the gradient applied at the previous step; the loss ends at 0.93 of its "
            "start, against 0.31 with zero_grad() at every step; gradient norm <= 10",
        ),
        build=_not_zeroed_per_batch_gru,
    ),
]


def _healthy(name: str, arch: str, description: str, build: Callable[[], Run], evidence: str) -> Scenario:
    truth = c.truth(evidence=f"{c.HEALTHY.evidence}; {evidence}")
    return Scenario(name=name, arch=arch, description=description, truth=truth, build=build)


SCENARIOS += [
    _healthy(
        "holdout_healthy_sparse_relu_autoencoder",
        "mlp",
        "A wide ReLU autoencoder with an L1 code penalty: most code units are zero on any sample, but each "
        "fires on some.",
        _healthy_sparse_autoencoder,
        "71-76% of the code elements are zero at every step, yet at most 1% of the code units are dead",
    ),
    _healthy(
        "holdout_healthy_zero_init_residual",
        "resnet",
        "A small ResNet whose blocks' last BatchNorm scale starts at zero (the Goyal et al. trick): the "
        "branches get no gradient at step 0 and then learn.",
        _healthy_zero_init_resnet,
        "every branch conv gets exactly zero gradient at step 0 and a non-zero one from step 1",
    ),
    _healthy(
        "holdout_healthy_frozen_pretrained_embedding_gru",
        "rnn",
        "A GRU classifier over frozen pretrained word vectors (Embedding.from_pretrained, freeze=True) with "
        "a trained GRU and head.",
        _healthy_frozen_embedding_gru,
        "the embedding is frozen by design (requires_grad=False); the GRU and head change at every step",
    ),
    _healthy(
        "holdout_healthy_vgg_bn_eval_passes",
        "cnn",
        "A VGG-style CNN with BatchNorm (momentum 0.01) and cosine annealing, switched to eval mode for a "
        "no_grad validation pass every 10 steps.",
        _healthy_vgg_bn_eval,
        "the eval-mode validation loss falls 0.60 -> 0.19 -> 0.10 -> 0.07",
    ),
    _healthy(
        "holdout_healthy_multitask_dropout",
        "mlp",
        "A two-head multi-task MLP (CE + MSE summed) with Dropout(0.5) after every trunk layer, trained with Adam.",
        _healthy_multitask_dropout,
        "last/first loss 0.70; no trunk ReLU ever more than 2% dead",
    ),
    _healthy(
        "holdout_healthy_label_smoothing_transformer",
        "transformer",
        "A token classifier of hand-written pre-norm nn.MultiheadAttention blocks trained with AdamW and "
        "label smoothing 0.1 (the loss cannot reach 0).",
        _healthy_label_smoothing_transformer,
        "the smoothed loss falls 1.14 -> 0.59, its floor being well above 0",
    ),
    _healthy(
        "holdout_healthy_siamese_contrastive",
        "mlp",
        "A siamese encoder called twice per step (once per side of a pair) and trained with a contrastive margin loss.",
        _healthy_siamese,
        "both ReLU layers (each used twice per step) stay <= 2% dead; last/first loss 0.10",
    ),
    _healthy(
        "holdout_healthy_bf16_autocast_audio",
        "cnn",
        "A Conv1d audio classifier trained with Adam under torch.autocast('cpu', dtype=torch.bfloat16).",
        _healthy_bf16_audio,
        "the convolutions run in bfloat16 under the loop's autocast; last/first loss 0.02",
    ),
    _healthy(
        "holdout_healthy_gan_feature_matching",
        "mlp",
        "A GAN watched as a whole (generator and discriminator in one module, two Adam optimizers, "
        "alternating steps) whose generator uses feature matching.",
        _healthy_gan,
        "feature-matching loss 5.3 -> 0.08; |mean diff| + |cov diff| of samples vs data 2.8 -> 0.5",
    ),
    _healthy(
        "holdout_healthy_clipped_lstm_lm",
        "rnn",
        "An LSTM language model trained with SGD at lr 5 and clip_grad_norm_(0.25), the word_language_model "
        "recipe: clipping is active at most steps, and harmless.",
        _healthy_clipped_lstm_lm,
        "the raw gradient norm is above the 0.25 clip threshold at 83% of the steps; loss 3.48 -> 1.27",
    ),
    _healthy(
        "holdout_healthy_unet_denoiser_adamw",
        "cnn",
        "A small U-Net (max-pool down, transposed-conv up, skip concat) trained as an MSE denoiser with AdamW "
        "and weight decay 0.05.",
        _healthy_unet_adamw,
        "no ReLU ever more than 28% dead; last/first loss 0.13",
    ),
    _healthy(
        "holdout_healthy_onecycle_warmup_separable",
        "cnn",
        "A depthwise-separable CNN trained with Nesterov SGD under OneCycleLR with div_factor 1e4: the first "
        "steps run at an lr of ~1e-5.",
        _healthy_onecycle_separable,
        "update/weight ratio 1.3e-6 at step 0, 2.9e-4 at step 1 and ~1e-2 after; last/first loss 0.03",
    ),
    _healthy(
        "holdout_healthy_small_lr_accumulation",
        "mlp",
        "An nn.ModuleDict MLP (F.gelu, F.silu, torch.tanh) trained with Adam at lr 2e-4, accumulating 4 "
        "micro-batches and clearing with zero_grad(set_to_none=False).",
        _healthy_small_lr_accumulation,
        "last/first loss 0.47 over 120 steps; the functional tanh is never saturated",
    ),
    _healthy(
        "holdout_healthy_frozen_after_optimizer",
        "transformer",
        "Fine-tuning a pre-norm attention classifier whose embeddings and first block get requires_grad_(False) "
        "after AdamW was built over every parameter: the optimizer holds them, but they get no gradient.",
        _healthy_frozen_after_optimizer,
        "the 14 tensors with requires_grad=False are in AdamW's param groups, get no gradient and never change; "
        "last/first loss 0.35",
    ),
    _healthy(
        "holdout_healthy_fast_fir_fit",
        "cnn",
        "A linear Conv1d filter bank fits a fixed FIR filter from white noise with Adam, reaching a tiny loss "
        "within a few dozen steps.",
        _healthy_fast_fir_fit,
        "the loss falls from 1.09 to 1.3e-4 and the gradient norm 100-fold, which is convergence",
    ),
]
